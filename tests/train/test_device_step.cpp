// A full trainer step on the simulated device: no device->host read and no
// wait on steps that do not log, validate or checkpoint; exactly the
// documented reads on a step that logs (docs/devices.md):
// the health flag, the loss sums and one per layer that ran; uploads only
// of the batch, the optimizer's step scalars and the revival's draw lists
// (never of constants); and
// the CPU's bits. A read added anywhere in the step fails here.
#include <doctest/doctest.h>

#include <map>
#include <mutex>

#include "engine/device_counters.h"
#include "tests/engine/tmpdir.h"
#include "tests/train/small_run.h"
#include "vq/residual_vq.h"

using namespace vqddp;
using namespace vqddp::test;

namespace {

// Per rank, the counts of each step interval: entry s (0-based) is what the
// rank's thread did from after_step of step s (1-based), before that step's
// log, to after_step of step s + 1: step s's log (if it logged) and step
// s + 1's work.
std::map<int, std::vector<DeviceCounters>> counts_per_step(Config cfg, const Dataset& data) {
  std::map<int, std::vector<DeviceCounters>> counts;
  std::mutex mu;
  TrainOptions o = quiet();
  o.validate = false;
  o.checkpoints = false;
  o.after_step = [&](const StepView& v) {
    DeviceCounters c = device_counters();
    reset_device_counters();
    std::lock_guard lock(mu);
    counts[v.rank].push_back(c);
  };
  train(cfg, data, o);
  return counts;
}

}  // namespace

TEST_CASE("trainer on sim: zero reads and waits on steps that do not log; 2 + one per layer on a step that logs") {
  Dataset data = synthetic_data();
  for (std::string type : {"residual_vq", "fsq"})
    for (bool dropout : {false, true})
      for (int w : {1, 3}) {
        CAPTURE(type);
        CAPTURE(dropout);
        CAPTURE(w);
        TempDir dir;
        Config cfg = small_config(dir.path().string(), type);
        cfg.run.device = "sim";
        cfg.distributed.world_size = w;
        if (type == "residual_vq") test::set_quantizer_keys(cfg, {{"quantize_dropout", dropout}});
        cfg.schedule.log_every = 3;
        cfg.schedule.steps = 9;
        std::map<int, std::vector<DeviceCounters>> counts = counts_per_step(cfg, data);
        REQUIRE(counts.size() == static_cast<size_t>(w));
        const int64_t layers = type == "fsq" ? 1 : cfg.quantizer.as<ResidualVQOptions>().num_quantizers;
        for (const auto& [rank, steps] : counts) {
          REQUIRE(steps.size() >= 7);
          // Interval 0 holds the set-up and k-means init (one documented read).
          for (size_t s = 1; s < steps.size(); ++s) {
            CAPTURE(rank);
            CAPTURE(s);
            CAPTURE(steps[s].str());
            bool after_log = s % 3 == 0;  // holds the log of step s (1-based), a multiple of 3
            CHECK(steps[s].to_host == steps[s].waits);  // every wait is a read, nothing else waits
            if (!after_log) {
              CHECK(steps[s].to_host == 0);
            } else if (!dropout) {
              CHECK(steps[s].to_host == 2 + layers);  // health, loss sums, each layer's metrics
            } else {
              CHECK(steps[s].to_host >= 2);  // dropped layers have host metrics: no read
              CHECK(steps[s].to_host <= 2 + layers);
            }
            // Uploads: the batch, the optimizer's step scalars (its rate and
            // bias corrections), and for each codebook with revival its draw
            // lists (one, or two when the batch has fewer rows than codes).
            if (type == "fsq")
              CHECK(steps[s].to_device == 2);
            else
              CHECK(steps[s].to_device <= 2 + 2 * layers);
          }
        }
      }
}

TEST_CASE("trainer on sim ends in the CPU's bits, with W = 1 and W = 3 thread ranks") {
  Dataset data = synthetic_data();
  for (int w : {1, 3}) {
    CAPTURE(w);
    TempDir a, b;
    Config cpu = small_config(a.path().string());
    cpu.distributed.world_size = w;
    Config sim = cpu;
    sim.run.dir = b.path().string();
    sim.run.device = "sim";
    TrainResult rc = train(cpu, data, quiet()), rs = train(sim, data, quiet());
    CHECK(rs.validation_mse == rc.validation_mse);
    NamedTensors c = safetensors_load(a.path().string() + "/checkpoint.safetensors").tensors,
                 s = safetensors_load(b.path().string() + "/checkpoint.safetensors").tensors;
    CHECK(first_difference(s, c) == "");
  }
}

TEST_CASE("trainer on sim: a world of one and 3 thread ranks replay a captured step graph per step and end in the "
          "bits of issued launches and of the CPU; a step that picks its layers on the host replays each choice's "
          "graph") {
  Dataset data = synthetic_data();
  // Sanitized builds: the run without choices only (a choice splits the
  // same code's segments).
  for (int w : {1, 3})
    for (bool dropout : test::sanitized_build() ? std::vector<bool>{false} : std::vector<bool>{false, true}) {
      CAPTURE(w);
      CAPTURE(dropout);
      TempDir a, b, c;
      Config cpu = small_config(a.path().string());
      // 3 thread ranks: their collectives are launches of the graphed step
      // (comm/thread_group.cpp), and the run still ends in 3 ranks' CPU bits.
      cpu.distributed.world_size = w;
      test::set_quantizer_keys(cpu, {{"quantize_dropout", dropout}});
      Config graphed = cpu, issued = cpu;
      graphed.run.dir = b.path().string();
      graphed.run.device = "sim";
      issued.run.dir = c.path().string();
      issued.run.device = "sim";
      issued.run.step_graphs = false;
      TrainResult rc = train(cpu, data, quiet()), rg = train(graphed, data, quiet()), ri = train(issued, data, quiet());
      // Steps 1-2 are issued (k-means, the optimizer's first step), step 3 is
      // captured, every later one a replay; validation and logs run between.
      // With quantize dropout (3 layers, the last active one drawn each step)
      // a step is not replayed when it makes a choice the first or second
      // time (issued, then captured): at most 6 such steps from step 3 on.
      if (dropout) {
        CHECK(rg.graph_replays >= rg.steps - 2 - 6);
        CHECK(rg.graph_replays > 0);
        CHECK(rg.graph_replays <= rg.steps - 3);
      } else {
        CHECK(rg.graph_replays == rg.steps - 3);
      }
      CHECK(ri.graph_replays == 0);
      CHECK(rc.graph_replays == 0);
      CHECK(rg.validation_mse == ri.validation_mse);
      CHECK(rg.validation_mse == rc.validation_mse);
      NamedTensors tc = safetensors_load(a.path().string() + "/checkpoint.safetensors").tensors,
                   tg = safetensors_load(b.path().string() + "/checkpoint.safetensors").tensors,
                   ti = safetensors_load(c.path().string() + "/checkpoint.safetensors").tensors;
      CHECK(first_difference(tg, ti) == "");
      CHECK(first_difference(tg, tc) == "");
    }
}

TEST_CASE("trainer on sim: a loss that turns non-finite on a step that does not log throws on every rank at the next "
          "check, and no checkpoint of it is written") {
  Dataset data = synthetic_data();
  TempDir dir;
  Config cfg = small_config(dir.path().string());
  cfg.run.device = "sim";
  cfg.distributed.world_size = 3;
  cfg.schedule.steps = 8;
  cfg.schedule.log_every = 4;
  cfg.schedule.validate_every = 0;
  cfg.schedule.checkpoint_every = 2;
  TrainOptions o = quiet();
  o.validate = false;
  // After step 2 (checkpointed) rank 1's decoder weights become NaN: step 3's
  // loss is NaN there, and no rank reads anything until step 4's check.
  o.after_step = [&](const StepView& v) {
    if (v.step == 2 && v.rank == 1) v.codec.named_parameters().back().second.fill_(std::nanf(""));
  };
  std::string message;
  try {
    train(cfg, data, o);
  } catch (const NonFiniteError& e) {
    message = e.what();
  }
  CHECK(message.find("a training loss was not finite at a step in (2, 4]") != std::string::npos);
  // The checkpoint on disk is step 2's: the diverged weights were never written.
  CHECK(safetensors_load(dir.path().string() + "/checkpoint.safetensors").at("train.step").item<int64_t>() == 2);
}

TEST_CASE("run.precision tf32 and bf16: the products' inputs rounded, exactly on every device; 3 thread ranks on sim "
          "(graphed) end in 1 CPU rank's bits, and not in fp32's") {
  Dataset data = synthetic_data();
  TempDir base;
  Config fp32 = small_config(base.path().string());
  fp32.distributed.world_size = 1;
  test::set_quantizer_keys(fp32, {{"quantize_dropout", false}});  // as the runs below: only the precision differs
  train(fp32, data, quiet());
  const NamedTensors reference = safetensors_load(base.path().string() + "/checkpoint.safetensors").tensors;
  std::vector<NamedTensors> ends;
  for (std::string precision : {"tf32", "bf16"}) {
    CAPTURE(precision);
    TempDir a, b;
    Config one = small_config(a.path().string());
    one.distributed.world_size = 1;
    one.run.precision = precision;
    test::set_quantizer_keys(one, {{"quantize_dropout", false}});  // one launch sequence a step
    Config three = one;
    three.run.dir = b.path().string();
    three.run.device = "sim";
    three.distributed.world_size = 3;
    TrainResult r1 = train(one, data, quiet()), r3 = train(three, data, quiet());
    CHECK(r3.graph_replays == r3.steps - 3);
    NamedTensors t1 = safetensors_load(a.path().string() + "/checkpoint.safetensors").tensors,
                 t3 = safetensors_load(b.path().string() + "/checkpoint.safetensors").tensors;
    CHECK(first_difference(t3, t1) == "");
    CHECK(first_difference(t1, reference) != "");  // the rounding moved bits
    ends.push_back(t1);
  }
  CHECK(first_difference(ends[0], ends[1]) != "");  // tf32 is not bf16
}

