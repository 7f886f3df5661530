// Exact data parallelism (engine/exact_batch.h): a whole run on W ranks,
// any split of the batch into whole units (uneven, ranks without rows), is
// bit for bit the run on 1 rank in every checkpoint tensor, on the CPU and
// on sim; and a run stopped on W ranks resumes on W' ranks into the bytes
// of the uninterrupted run.
#include <doctest/doctest.h>

#include <fstream>
#include <mutex>

#include "comm/batch_reduce.h"
#include "comm/rank_order.h"
#include "comm/thread_group.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "tests/engine/tmpdir.h"
#include "tests/train/small_run.h"
#include "train/checkpoint.h"
#include "vq/masked_rows.h"

using namespace vqddp;
using namespace vqddp::test;

namespace {

// k-means init, revival, quantize dropout (small_config), the cosine
// schedule and clipping that binds, for `steps` steps.
Config exact_config(const std::string& dir, const std::string& type, int64_t steps) {
  Config cfg = small_config(dir, type == "lfq" ? "residual_vq" : type);
  if (type == "lfq") {
    nlohmann::json q = {{"type", "residual_lfq"}, {"num_quantizers", 2}, {"codebook_size", 16},
                        {"entropy_loss_weight", 0.1}, {"diversity_gamma", 1.0}};
    cfg.quantizer = parse_config({{"model", {{"hidden", 32}, {"hidden_layers", 1}, {"latent_dim", 4}}},
                                  {"quantizer", q},
                                  {"data", {{"type", "wav_frames"}, {"sources", {{{"path", "unused"}}}}}},
                                  {"run", {{"dir", dir}}}},
                                 "test")
                        .quantizer;
  }
  cfg.schedule.steps = steps;
  cfg.optimizer.lr_schedule = "cosine";
  cfg.optimizer.grad_clip = 0.05f;  // small enough to scale most steps
  return cfg;
}

// What a run leaves: every checkpoint tensor after the last step (every
// rank must hold rank 0's bytes), and, with `logged`, every metrics line
// (loss, recon, perplexity, codes used, revived; validation) but its speed
// and the last validation's numbers.
struct RunState {
  NamedTensors tensors;
  std::vector<std::string> metrics;
  std::vector<double> validation;
};

RunState final_state(const Config& cfg, const Dataset& data, int world, std::vector<int64_t> rank_units,
                     TrainOptions opt = {}, bool logged = false) {
  Config c = cfg;
  c.distributed.world_size = world;
  c.run.dir += fmt::format("/w{}-{}", world, fmt::join(rank_units, "-"));
  opt.print = logged;
  opt.overwrite = true;  // the same W and split runs once per case
  opt.validate = logged;
  opt.checkpoints = false;
  opt.rank_units = std::move(rank_units);
  const int64_t last = cfg.schedule.steps;
  std::vector<NamedTensors> ranks(world);
  std::mutex mu;
  opt.after_step = [&](const StepView& v) {
    if (v.step != last) return;
    NamedTensors t = copies_on(checkpoint_tensors(v.parts), Device::cpu());
    std::lock_guard lock(mu);
    ranks[v.rank] = std::move(t);
  };
  TrainResult r = train(c, data, opt);
  for (int q = 1; q < world; ++q) CHECK_MESSAGE(bitwise_equal(ranks[q], ranks[0]), "rank " << q);
  RunState out{ranks[0], {}, {r.validation_mse, r.validation_snr_db, r.validation_log_mel}};
  for (const LayerUsage& u : r.usage) out.validation.insert(out.validation.end(), {u.perplexity, double(u.codes_used)});
  if (logged) {
    std::ifstream in(c.run.dir + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      nlohmann::json j = nlohmann::json::parse(line);
      j.erase("steps_per_s");
      out.metrics.push_back(j.dump());
    }
  }
  return out;
}

}  // namespace

TEST_CASE("a whole run on W ranks, any split into whole units, is bit for bit the 1-rank run (W = 1..8)") {
  TempDir dir;
  Dataset data = synthetic_data();
  // Sanitized builds: 8 steps and the even splits of W = 2, 5 and 8 only.
  const bool light = sanitized_build();
  for (const std::string type : {"residual_vq", "fsq", "lfq"}) {
    CAPTURE(type);
    Config cfg = exact_config(dir.path().string(), type, light ? 8 : 20);
    RunState one = final_state(cfg, data, 1, {}, {}, true);
    REQUIRE(one.tensors.size() > 10);
    REQUIRE(one.metrics.size() >= (light ? 3u : 7u));  // log_every 3 and validate_every 4
    // Batch 30: 30 units of one example. Even splits for every W, and
    // uneven ones with ranks that hold no rows.
    std::vector<std::pair<int, std::vector<int64_t>>> splits{{3, {20, 0, 10}}, {8, {1, 5, 0, 9, 4, 0, 6, 5}}};
    if (type == "residual_vq")
      for (int w = 2; w <= 8; ++w)
        if (!light || w == 2 || w == 5 || w == 8) splits.push_back({w, {}});
    for (const auto& [world, units] : splits) {
      CAPTURE(world);
      CAPTURE(units.empty() ? std::string("even") : fmt::format("{}", fmt::join(units, ",")));
      // The uneven splits also log and validate: every metric the same too.
      RunState w = final_state(cfg, data, world, units, {}, !units.empty());
      CHECK(first_difference(w.tensors, one.tensors) == "");
      if (!units.empty()) {
        CHECK(w.metrics == one.metrics);
        CHECK(w.validation == one.validation);
      }
    }
  }
}

TEST_CASE("a whole run is the 1-rank run whatever order the backend adds the ranks in (NCCL fixes none): "
          "descending and rotated orders on 3 uneven and 4 even ranks") {
  TempDir dir;
  Dataset data = synthetic_data();
  for (const std::string type : {"residual_vq", "lfq"}) {
    CAPTURE(type);
    Config cfg = exact_config(dir.path().string(), type, sanitized_build() ? 8 : 20);
    RunState one = final_state(cfg, data, 1, {}, {}, true);
    for (ReduceOrder order : {ReduceOrder{true, 0}, ReduceOrder{false, 1}, ReduceOrder{true, 2}}) {
      CAPTURE(order.descending);
      CAPTURE(order.rotate);
      set_reduce_order(order);
      RunState uneven = final_state(cfg, data, 3, {20, 0, 10}, {}, true);
      RunState even = final_state(cfg, data, 4, {});
      set_reduce_order({});
      CHECK(first_difference(uneven.tensors, one.tensors) == "");
      CHECK(uneven.metrics == one.metrics);
      CHECK(first_difference(even.tensors, one.tensors) == "");
    }
  }
}

TEST_CASE("a whole run on sim (every device path of the step) equals the CPU run, on 1 and on 3 uneven ranks") {
  TempDir dir;
  Dataset data = synthetic_data();
  Config cfg = exact_config(dir.path().string(), "residual_vq", 20);
  NamedTensors cpu = final_state(cfg, data, 1, {}).tensors;
  cfg.run.device = "sim";
  CHECK(first_difference(final_state(cfg, data, 1, {}).tensors, cpu) == "");
  CHECK(first_difference(final_state(cfg, data, 3, {4, 0, 26}).tensors, cpu) == "");
}

TEST_CASE("elastic resume: stopped on W ranks and resumed on W' ranks ends in the bytes of the uninterrupted run") {
  TempDir dir;
  Dataset data = synthetic_data();
  Config cfg = exact_config(dir.path().string() + "/straight", "residual_vq", 20);
  NamedTensors straight = final_state(cfg, data, 1, {}).tensors;
  for (auto [first, second] : {std::pair{4, 3}, std::pair{1, 5}}) {
    CAPTURE(first);
    CAPTURE(second);
    Config c = cfg;
    c.run.dir = dir.path().string() + fmt::format("/elastic-{}-{}", first, second);
    c.distributed.world_size = first;
    TrainOptions stop;
    stop.print = false;
    stop.stop_at_step = 8;
    train(c, data, stop);
    TrainOptions resume;
    resume.resume = c.run.dir + "/checkpoint.safetensors";
    CHECK(first_difference(final_state(c, data, second, {}, resume).tensors, straight) == "");
  }
}

TEST_CASE("an exact step gives every rank the global batch's loss and gradient of a linear layer and its bias") {
  // 5 examples of 2 rows each (x [10, 3]) through y = x W^T + b and the
  // global mean of y^2: W ranks on whole units == 1 rank, bit for bit.
  Generator g(11, 0);
  Tensor x = rand_normal({10, 3}, g), w0 = rand_normal({4, 3}, g), b0 = rand_normal({4}, g);
  auto step = [&](Communicator& comm, const std::vector<int64_t>& rank_units) {
    std::vector<int64_t> bounds{0};
    for (int64_t u : rank_units) bounds.push_back(bounds.back() + u);
    std::vector<int64_t> mine(rank_units[comm.rank()], 1);
    Tensor w = w0.clone().set_requires_grad(true), b = b0.clone().set_requires_grad(true);
    ExactBatchScope exact(exact_batch_for(comm, mine, rank_units));
    Tensor xs = x.slice_rows(2 * bounds[comm.rank()], 2 * bounds[comm.rank() + 1]);
    Tensor loss = batch_mean(square(add(matmul(xs, w, false, true), b)), comm);
    loss.backward();
    return std::vector<Tensor>{loss.detach(), w.grad(), b.grad()};
  };
  std::vector<Tensor> one;
  run_ranks(1, [&](Communicator& comm) { one = step(comm, {5}); });
  for (auto units : {std::vector<int64_t>{2, 3}, std::vector<int64_t>{0, 4, 1}, std::vector<int64_t>{1, 1, 1, 2, 0}}) {
    std::mutex mu;
    run_ranks(static_cast<int>(units.size()), [&](Communicator& comm) {
      std::vector<Tensor> got = step(comm, units);
      std::lock_guard lock(mu);
      for (size_t i = 0; i < got.size(); ++i) CHECK(bitwise_equal({{"t", got[i]}}, {{"t", one[i]}}));
    });
  }
}

TEST_CASE("batch_means takes many global means in one collective, each the bits of its own batch_mean, gradients too") {
  // Three losses' worth of means (a GAN's feature matching takes two per
  // feature map) over 5 examples on uneven splits, an empty rank included:
  // each value and each input's gradient equals batch_mean's alone, and
  // the whole list costs one collective where batch_mean costs one each.
  Generator g(12, 0);
  Tensor a0 = rand_normal({5, 3}, g), b0 = rand_normal({10, 2}, g), c0 = rand_normal({5, 1}, g);
  auto step = [&](Communicator& comm, const std::vector<int64_t>& rank_units, bool together) {
    std::vector<int64_t> bounds{0};
    for (int64_t u : rank_units) bounds.push_back(bounds.back() + u);
    const int64_t lo = bounds[comm.rank()], hi = bounds[comm.rank() + 1];
    ExactBatchScope exact(exact_batch_for(comm, std::vector<int64_t>(hi - lo, 1), rank_units));
    Tensor a = a0.slice_rows(lo, hi).clone().set_requires_grad(true);
    Tensor b = b0.slice_rows(2 * lo, 2 * hi).clone().set_requires_grad(true);
    Tensor c = c0.slice_rows(lo, hi).clone().set_requires_grad(true);
    const std::vector<Tensor> xs{square(a), abs(b), c};
    const uint64_t before = comm.counters().collectives;
    std::vector<Tensor> means;
    if (together) {
      means = batch_means(xs, comm);
    } else {
      for (const Tensor& x : xs) means.push_back(batch_mean(x, comm));
    }
    CHECK(comm.counters().collectives - before == (together ? 1u : xs.size()));
    add(add(means[0], mul(means[1], 2.f)), means[2]).backward();
    return std::vector<Tensor>{means[0].detach(), means[1].detach(), means[2].detach(), a.grad(), b.grad(), c.grad()};
  };
  for (auto units : {std::vector<int64_t>{5}, std::vector<int64_t>{2, 3}, std::vector<int64_t>{0, 4, 1}}) {
    CAPTURE(units.size());
    std::mutex mu;
    run_ranks(static_cast<int>(units.size()), [&](Communicator& comm) {
      std::vector<Tensor> each = step(comm, units, false), once = step(comm, units, true);
      std::lock_guard lock(mu);
      for (size_t i = 0; i < each.size(); ++i) {
        CAPTURE(i);
        CHECK(bitwise_equal({{"t", once[i]}}, {{"t", each[i]}}));
      }
    });
  }
}

TEST_CASE("a quantizer mask is refused in an exact step, and an op without unit partials fails naming itself") {
  run_ranks(1, [&](Communicator& comm) {
    ExactBatchScope exact(exact_batch_for(comm, {1, 1, 1}, {3}));
    Tensor mask = from_vector(std::vector<int64_t>{1, 0, 1}, {3});
    CHECK_THROWS_WITH_AS(MaskedRows(mask, 3, 0), doctest::Contains("mask cannot be used in an exact step"), Error);
    // concat has no unit partials for a parameter beside batched rows.
    Tensor w = zeros({3, 1}).set_requires_grad(true);
    Tensor x = ones({3, 2});
    Tensor loss = batch_mean(concat({x, w}, 1), comm);
    CHECK_THROWS_WITH_AS(loss.backward(), doctest::Contains("'concat' does not support exact data parallelism"), Error);
  });
}
