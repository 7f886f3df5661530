// A full trainer step on the simulated device: no device->host read and no
// wait on steps that do not log, validate or checkpoint; exactly the
// documented reads on a step that logs (README "Device transfers"); and the
// CPU's bits. A read added anywhere in the step fails here.
#include <doctest/doctest.h>

#include <map>
#include <mutex>

#include "engine/device_counters.h"
#include "tests/engine/tmpdir.h"
#include "tests/train/small_run.h"

using namespace vqddp;
using namespace vqddp::test;

namespace {

// Per rank, the counts of each step interval: entry s is what the rank's
// thread did from the end of step s - 1 (after its log) to the end of step
// s, before that step's log.
std::map<int, std::vector<DeviceCounters>> counts_per_step(Config cfg, const Dataset& data) {
  std::map<int, std::vector<DeviceCounters>> counts;
  std::mutex mu;
  TrainOptions o = quiet();
  o.validate = false;
  o.checkpoints = false;
  o.after_step = [&](int64_t, int rank, const CodecModel&, Optimizer&) {
    DeviceCounters c = device_counters();
    reset_device_counters();
    std::lock_guard lock(mu);
    counts[rank].push_back(c);
  };
  train(cfg, data, o);
  return counts;
}

}  // namespace

TEST_CASE("trainer on sim: zero reads and waits on steps that do not log; 1 + one per layer on a step that logs") {
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
        cfg.quantizer.quantize_dropout = dropout;
        cfg.schedule.log_every = 3;
        cfg.schedule.steps = 9;
        std::map<int, std::vector<DeviceCounters>> counts = counts_per_step(cfg, data);
        REQUIRE(counts.size() == static_cast<size_t>(w));
        const int64_t layers = type == "fsq" ? 1 : cfg.quantizer.num_quantizers;
        for (const auto& [rank, steps] : counts) {
          REQUIRE(steps.size() >= 7);
          // Interval 0 holds the set-up and k-means init (one documented read).
          for (size_t s = 1; s < steps.size(); ++s) {
            CAPTURE(rank);
            CAPTURE(s);
            CAPTURE(steps[s].str());
            bool after_log = s % 3 == 0;  // step s (counted from 0) follows step s, which logged, 1-based
            CHECK(steps[s].to_host == steps[s].waits);  // every wait is a read, nothing else waits
            if (!after_log) {
              CHECK(steps[s].to_host == 0);
            } else if (!dropout) {
              CHECK(steps[s].to_host == 1 + layers);
            } else {
              CHECK(steps[s].to_host >= 1);  // dropped layers have host metrics: no read
              CHECK(steps[s].to_host <= 1 + layers);
            }
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
