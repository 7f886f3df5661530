#include "tool/replay.h"

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <sstream>

#include "comm/errors.h"
#include "comm/single.h"
#include "comm/thread_group.h"
#include "engine/ops.h"
#include "engine/core/parse_number.h"
#include "engine/core/safetensors.h"
#include "engine/core/count_limits.h"
#include "engine/autograd.h"
#include "engine/exact_batch.h"
#include "engine/core/streams.h"
#include "comm/batch_reduce.h"
#include "tool/reference_quantizer.h"
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
// docs/design.md section 1; unknown keys are errors.
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


namespace {

// The batches x.0, x.1, ... of width `dim` and their optional upstream
// gradients g.i; any other tensor must be one `known` accepts.
struct Batches {
  std::vector<Tensor> x, g;  // g[i] undefined where the file has no g.i
};

Batches read_batches(const SafetensorsFile& f, int64_t dim, const std::function<bool(const std::string&)>& known) {
  Batches b;
  for (int i = 0; f.contains("x." + std::to_string(i)); ++i) {
    const std::string xi = "x." + std::to_string(i), gi = "g." + std::to_string(i);
    const Tensor& x = f.at(xi);
    VQDDP_CHECK(x.dtype() == DType::f32 && x.dim() == 2 && x.size(1) == dim, "{}: '{}' must be float32 [N, {}], got {}",
                f.path, xi, dim, x.desc());
    b.x.push_back(x);
    b.g.emplace_back();
    if (f.contains(gi)) {
      const Tensor& g = f.at(gi);
      VQDDP_CHECK(g.dtype() == DType::f32 && g.shape() == x.shape(), "{}: '{}' must be float32 {} like '{}', got {}",
                  f.path, gi, shape_str(x.shape()), xi, g.desc());
      b.g.back() = g;
    }
  }
  VQDDP_CHECK(!b.x.empty(), "{}: missing tensor 'x.0' (no batches to replay)", f.path);
  for (const auto& [name, t] : f.tensors) {
    bool ok = known(name);
    for (size_t i = 0; i < b.x.size(); ++i) ok |= name == "x." + std::to_string(i) || name == "g." + std::to_string(i);
    VQDDP_CHECK(ok, "{}: unexpected tensor '{}' (batches are numbered x.0, x.1, ... without gaps, gradients g.i "
                "beside them, and the state goes by the reference's state_dict names)", f.path, name);
  }
  return b;
}

void check_paths(const ReplayOptions& opt) {
  VQDDP_CHECK(limits::world.contains(opt.world), "replay: --world {}", limits::world.violation(std::to_string(opt.world)));
  std::error_code ec;
  VQDDP_CHECK(!std::filesystem::equivalent(opt.input, opt.output, ec),
              "replay: the output {} is the input file: it would be overwritten (give another output path)", opt.output);
}

// Rank 0's record of a replayed step: every rank holds these alike (the
// global batch's losses, the global gradient of the parameters, the state
// after the step).
NamedTensors lead_record(const QuantizerOutput& out, const Quantizer& m, const std::vector<ReferenceSlot>& slots,
                         bool backward) {
  NamedTensors o;
  o.emplace_back("loss", out.loss.detach().clone());
  if (!out.layer_losses.empty()) {
    std::vector<Tensor> each;
    for (const Tensor& l : out.layer_losses) each.push_back(l.detach().reshape({1}));
    o.emplace_back("losses", concat(each, 0));
  }
  for (const auto& [name, t] : out.extras) o.emplace_back(name, t.detach().clone());
  if (backward) {
    NamedTensors param_grads;
    for (const auto& [name, p] : m.named_parameters())
      if (p.grad().defined()) param_grads.emplace_back(name, p.grad());
    for (const auto& [name, t] : to_reference(param_grads, slots)) o.emplace_back("grad." + name, t);
  }
  for (const auto& [name, t] : reference_state(m, slots)) o.emplace_back(name, t);
  return o;
}

// The output file: the input's metadata with the world size, and `out`.
void save_replay(const ReplayOptions& opt, const SafetensorsFile& f, const NamedTensors& out) {
  std::map<std::string, std::string> meta = f.metadata;
  meta["world"] = std::to_string(opt.world);
  safetensors_save(opt.output, out, meta);
}

// A whole quantizer described by the reference's class, keys and state
// names: each step an exact training step on W thread ranks (one unit per
// row, so any split gives 1 rank's bits), with backward() of
// sum(quantized * g.i) + loss where g.i is given.
int replay_quantizer(const ReplayOptions& opt, const SafetensorsFile& f) {
  const ReferenceQuantizer ref = reference_quantizer(f.metadata, opt.input);
  auto make = [&] {
    Generator init(ref.seed, streams::kInit);
    return make_quantizer(ref.options, ref.dim, ref.seed, init);
  };
  std::shared_ptr<Quantizer> probe = make();
  const std::vector<ReferenceSlot> slots = reference_slots(ref.options, *probe);
  const std::vector<std::string> state_names = load_reference_state(*probe, slots, f);  // checks every slot once
  const std::set<std::string> state(state_names.begin(), state_names.end());
  const Batches b = read_batches(f, ref.dim, [&](const std::string& name) {
    return state.contains(name) || is_reference_constant(ref.options, name);
  });
  std::vector<int64_t> rows;
  for (const Tensor& x : b.x) rows.push_back(x.size(0));
  const std::vector<std::vector<int64_t>> shards = parse_shards(opt.shards, rows, opt.world);

  const size_t steps = b.x.size();
  std::vector<std::vector<Tensor>> quantized(steps, std::vector<Tensor>(opt.world)),
      indices(steps, std::vector<Tensor>(opt.world)), grads(steps, std::vector<Tensor>(opt.world));
  std::vector<NamedTensors> lead(steps);  // rank 0's losses, parameter gradients and state, per step
  run_ranks(opt.world, [&](Communicator& comm) {
    std::shared_ptr<Quantizer> m = make();
    load_reference_state(*m, slots, f);
    m->train();
    const int r = comm.rank();
    for (size_t s = 0; s < steps; ++s) {
      const int64_t begin = shard_begin(shards[s], r), n = shards[s][r];
      ExactBatchScope exact(exact_batch_for(comm, std::vector<int64_t>(n, 1), shards[s]));
      Tensor x = b.x[s].slice_rows(begin, begin + n).clone();
      const bool backward = b.g[s].defined();
      if (backward) requires_input_grad(x);
      QuantizerOutput out;
      try {
        out = m->quantize(x, comm);
        if (backward) {
          Tensor objective = add(sum(mul(out.quantized, b.g[s].slice_rows(begin, begin + n))), out.loss);
          if (objective.requires_grad()) objective.backward();  // targets only (random_projection): no gradient
        }
      } catch (const NonFiniteError& e) {
        rethrow_nonfinite(e, fmt::format("{}: batch x.{} (rows {} to {} on rank {}): {}", opt.input, s, begin,
                                         begin + n, r, e.what()));
      }
      quantized[s][r] = out.quantized.detach().clone();
      indices[s][r] = out.indices.clone();
      if (backward) grads[s][r] = x.grad().defined() ? x.grad().clone() : zeros(x.shape());
      if (r == 0) lead[s] = lead_record(out, *m, slots, backward);
      m->zero_grad();  // replay steps no optimizer: each step's gradients are its own
    }
  });

  NamedTensors out;
  for (size_t s = 0; s < steps; ++s) {
    out.emplace_back(fmt::format("quantized.{}", s), concat(quantized[s], 0));
    out.emplace_back(fmt::format("indices.{}", s), concat(indices[s], 0));
    if (b.g[s].defined()) out.emplace_back(fmt::format("grad.x.{}", s), concat(grads[s], 0));
    for (const auto& [name, t] : lead[s]) out.emplace_back(fmt::format("{}.{}", name, s), t);
  }
  std::set<std::string> names;
  for (const auto& [name, t] : out)
    VQDDP_CHECK(names.insert(name).second, "replay: two outputs are named '{}' (a state name meets an output's)", name);
  save_replay(opt, f, out);
  return static_cast<int>(steps);
}

// A codebook replay file (embed, embed_avg, cluster_size, x.0, ...),
// every tensor checked.
struct CodebookReplay {
  CodebookOptions options;
  float weight = 1.f;  // the commitment weight
  std::vector<Tensor> batches;
};

CodebookReplay read_codebook_replay(const SafetensorsFile& f, const std::string& path) {
  CodebookReplay r;
  CodebookOptions& o = r.options;
  o = replay_codebook_options(f, path, r.weight);
  for (const char* name : {"embed", "embed_avg", "cluster_size"})
    VQDDP_CHECK(f.contains(name), "{}: missing tensor '{}' (a replay file holds embed, embed_avg, cluster_size, x.0, ...)",
                path, name);
  const Tensor &embed = f.at("embed"), &embed_avg = f.at("embed_avg"), &cluster_size = f.at("cluster_size");
  VQDDP_CHECK(embed.dim() == 2 && embed.dtype() == DType::f32, "{}: 'embed' must be float32 [K, D], got {}", path,
              embed.desc());
  o.codebook_size = embed.size(0);
  o.dim = embed.size(1);
  VQDDP_CHECK(embed_avg.shape() == embed.shape() && embed_avg.dtype() == DType::f32,
              "{}: 'embed_avg' must be float32 {}, got {}", path, shape_str(embed.shape()), embed_avg.desc());
  VQDDP_CHECK(cluster_size.shape() == Shape{o.codebook_size} && cluster_size.dtype() == DType::f32,
              "{}: 'cluster_size' must be float32 [{}], got {}", path, o.codebook_size, cluster_size.desc());
  for (int i = 0; f.contains("x." + std::to_string(i)); ++i) {
    const Tensor& x = f.at("x." + std::to_string(i));
    VQDDP_CHECK(x.dtype() == DType::f32 && x.dim() == 2 && x.size(1) == o.dim, "{}: 'x.{}' must be float32 [N, {}], got {}",
                path, i, o.dim, x.desc());
    r.batches.push_back(x);
  }
  VQDDP_CHECK(!r.batches.empty(), "{}: missing tensor 'x.0' (no batches to replay)", path);
  for (const auto& [name, t] : f.tensors) {
    bool known = name == "embed" || name == "embed_avg" || name == "cluster_size";
    for (size_t i = 0; i < r.batches.size(); ++i) known |= name == "x." + std::to_string(i);
    VQDDP_CHECK(known, "{}: unexpected tensor '{}' (batches must be numbered x.0, x.1, ... without gaps)", path, name);
  }
  return r;
}

// One codebook's forward, step after step, on W thread ranks.
int replay_codebook(const ReplayOptions& opt, const SafetensorsFile& f) {
  const CodebookReplay replay = read_codebook_replay(f, opt.input);
  const CodebookOptions& o = replay.options;
  const std::vector<Tensor>& batches = replay.batches;
  const float weight = replay.weight;
  const Tensor &embed = f.at("embed"), &embed_avg = f.at("embed_avg"), &cluster_size = f.at("cluster_size");
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
        rethrow_nonfinite(e, fmt::format("{}: batch x.{} (rows {} to {} on rank {}): {}", opt.input, s, begin,
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
  save_replay(opt, f, out);
  return static_cast<int>(steps);
}

}  // namespace

int run_replay(const ReplayOptions& opt) {
  check_paths(opt);
  SafetensorsFile f = safetensors_load(opt.input);
  return f.metadata.contains("class") ? replay_quantizer(opt, f) : replay_codebook(opt, f);
}

}  // namespace vqddp
