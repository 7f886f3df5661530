#include "tool/replay.h"

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <sstream>

#include "comm/single.h"
#include "comm/thread_group.h"
#include "engine/ops.h"
#include "engine/parse_number.h"
#include "engine/safetensors.h"
#include "engine/count_limits.h"
#include "train/schedule.h"
#include "vq/codebook.h"
#include "vq/quantizer_options.h"
#include "vq/losses.h"

namespace vqddp {

namespace {

std::vector<std::vector<int64_t>> parse_shards(const std::string& spec, const std::vector<int64_t>& batch_rows,
                                               int world) {
  std::vector<std::vector<int64_t>> out;
  if (spec.empty()) {
    for (int64_t n : batch_rows) out.push_back(even_shards(n, world));
    return out;
  }
  std::vector<std::vector<int64_t>> lists;
  std::stringstream all(spec);
  std::string one;
  while (std::getline(all, one, ';')) {
    std::vector<int64_t> counts;
    std::stringstream items(one);
    std::string item;
    while (std::getline(items, item, ',')) {
      std::optional<int64_t> c = parse_int(item);
      VQDDP_CHECK(c, "replay: --shards: '{}' is not a row count", item);
      counts.push_back(*c);
    }
    VQDDP_CHECK(static_cast<int>(counts.size()) == world, "replay: --shards list '{}' has {} entries for --world {}",
                one, counts.size(), world);
    lists.push_back(counts);
  }
  VQDDP_CHECK(lists.size() == 1 || lists.size() == batch_rows.size(),
              "replay: --shards has {} lists for {} batches (give one list, or one per batch)", lists.size(),
              batch_rows.size());
  for (size_t b = 0; b < batch_rows.size(); ++b) {
    const auto& counts = lists.size() == 1 ? lists[0] : lists[b];
    int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    VQDDP_CHECK(total == batch_rows[b], "replay: --shards gives {} rows for batch x.{}, which has {}", total, b,
                batch_rows[b]);
    for (int64_t c : counts) VQDDP_CHECK(c >= 0, "replay: --shards has a negative row count");
    out.push_back(counts);
  }
  return out;
}

}  // namespace

// Codebook settings from the header metadata, read by the reader of a
// config's quantizer section (vq/quantizer_options.h): the same keys
// (use_cosine_sim, learnable_codebook, ...), the same checks. Metadata
// values are strings; each is read as the JSON value it spells ("0.99" a
// number, "true" a boolean) and kept as a string otherwise, so a wrong type
// is refused by name like a config's. Absent keys keep the defaults of
// VQ_SEMANTICS.md; unknown keys are errors.
CodebookOptions replay_codebook_options(const SafetensorsFile& f, const std::string& file, float& commitment_weight) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [key, v] : f.metadata) {
    nlohmann::json parsed = nlohmann::json::parse(v, nullptr, /*allow_exceptions=*/false);
    j[key] = parsed.is_discarded() ? nlohmann::json(v) : parsed;
  }
  ConfigSection s(j, "", file + " metadata");
  CodebookOptions o;
  read_codebook_options(s, o);
  commitment_weight = static_cast<float>(s.number("commitment_weight", 1.0));
  o.seed = s.unsigned_integer("seed", 0);
  if (o.learnable) s.fail("learnable_codebook", "must be false: replay steps EMA codebooks (embed_avg, cluster_size)");
  s.finish();
  return o;
}


int run_replay(const ReplayOptions& opt) {
  VQDDP_CHECK(limits::world.contains(opt.world), "replay: --world {}", limits::world.violation(std::to_string(opt.world)));
  std::error_code ec;
  VQDDP_CHECK(!std::filesystem::equivalent(opt.input, opt.output, ec),
              "replay: the output {} is the input file: it would be overwritten (give another output path)", opt.output);
  SafetensorsFile f = safetensors_load(opt.input);
  float weight = 1.f;
  CodebookOptions o = replay_codebook_options(f, opt.input, weight);
  for (const char* name : {"embed", "embed_avg", "cluster_size"})
    VQDDP_CHECK(f.contains(name), "{}: missing tensor '{}' (a replay file holds embed, embed_avg, cluster_size, x.0, ...)",
                opt.input, name);
  const Tensor &embed = f.at("embed"), &embed_avg = f.at("embed_avg"), &cluster_size = f.at("cluster_size");
  VQDDP_CHECK(embed.dim() == 2 && embed.dtype() == DType::f32, "{}: 'embed' must be float32 [K, D], got {}", opt.input,
              embed.desc());
  o.codebook_size = embed.size(0);
  o.dim = embed.size(1);
  VQDDP_CHECK(embed_avg.shape() == embed.shape() && embed_avg.dtype() == DType::f32,
              "{}: 'embed_avg' must be float32 {}, got {}", opt.input, shape_str(embed.shape()), embed_avg.desc());
  VQDDP_CHECK(cluster_size.shape() == Shape{o.codebook_size} && cluster_size.dtype() == DType::f32,
              "{}: 'cluster_size' must be float32 [{}], got {}", opt.input, o.codebook_size, cluster_size.desc());

  std::vector<Tensor> batches;
  for (int i = 0; f.contains("x." + std::to_string(i)); ++i) {
    const Tensor& x = f.at("x." + std::to_string(i));
    VQDDP_CHECK(x.dtype() == DType::f32 && x.dim() == 2 && x.size(1) == o.dim, "{}: 'x.{}' must be float32 [N, {}], got {}",
                opt.input, i, o.dim, x.desc());
    batches.push_back(x);
  }
  VQDDP_CHECK(!batches.empty(), "{}: missing tensor 'x.0' (no batches to replay)", opt.input);
  for (const auto& [name, t] : f.tensors) {
    bool known = name == "embed" || name == "embed_avg" || name == "cluster_size";
    for (size_t i = 0; i < batches.size(); ++i) known |= name == "x." + std::to_string(i);
    VQDDP_CHECK(known, "{}: unexpected tensor '{}' (batches must be numbered x.0, x.1, ... without gaps)", opt.input, name);
  }
  std::vector<int64_t> rows;
  for (const Tensor& x : batches) rows.push_back(x.size(0));
  std::vector<std::vector<int64_t>> shards = parse_shards(opt.shards, rows, opt.world);

  // Per batch and rank: the quantized rows and indices, joined in rank order.
  size_t steps = batches.size();
  std::vector<std::vector<Tensor>> quantized(steps, std::vector<Tensor>(opt.world)),
      indices(steps, std::vector<Tensor>(opt.world));
  std::vector<CodebookMetrics> metrics(steps);
  NamedTensors final_state;
  std::mutex mu;
  run_ranks(opt.world, [&](Communicator& comm) {
    Generator unused(0, 0);
    Codebook book(o, unused);
    if (!o.kmeans_init) {
      book.embed.copy_(embed);
      book.embed_avg.copy_(embed_avg);
      book.cluster_size.copy_(cluster_size);
    }
    for (size_t s = 0; s < steps; ++s) {
      int64_t begin = shard_begin(shards[s], comm.rank());
      CodebookOutput out;
      try {
        out = book.forward(batches[s].slice_rows(begin, begin + shards[s][comm.rank()]), comm);
      } catch (const NonFiniteError& e) {
        throw NonFiniteError(fmt::format("{}: batch x.{} (rows {} to {} on rank {}): {}", opt.input, s, begin,
                                         begin + shards[s][comm.rank()], comm.rank(), e.what()));
      }
      quantized[s][comm.rank()] = out.quantize;
      indices[s][comm.rank()] = out.indices;
      if (comm.rank() == 0) metrics[s] = out.metrics;
    }
    if (comm.rank() == 0) {
      std::lock_guard lock(mu);
      final_state = {{"embed", book.embed}, {"embed_avg", book.embed_avg}, {"cluster_size", book.cluster_size}};
    }
  });

  NamedTensors out = final_state;
  SingleCommunicator whole;  // the loss of the whole joined batch, on this thread
  for (size_t s = 0; s < steps; ++s) {
    Tensor q = concat(quantized[s], 0);  // (N, D), rank order = batch order
    out.emplace_back(fmt::format("indices.{}", s), concat(indices[s], 0));
    out.emplace_back(fmt::format("loss.{}", s), commitment_loss(q, batches[s], weight, whole));
    out.emplace_back(fmt::format("perplexity.{}", s), scalar(static_cast<float>(metrics[s].perplexity())));
    out.emplace_back(fmt::format("revived.{}", s), full({}, metrics[s].codes_revived(), DType::i64));
  }
  std::map<std::string, std::string> meta = f.metadata;
  meta["world"] = std::to_string(opt.world);
  safetensors_save(opt.output, out, meta);
  return static_cast<int>(steps);
}

}  // namespace vqddp
