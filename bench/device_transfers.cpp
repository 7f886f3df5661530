// Device transfers, waits, launches and layout-copy bytes per training step of each config given, on a
// device (sim by default; cuda when asked and present), measured by the
// engine's per-thread counters (engine/device_counters.h) on rank 0:
//   step:     a step that neither logs, validates nor checkpoints
//   log step: the interval holding a logging step's reads
// and steps/s of the run (on sim: the CPU's speed through the device path).
//   bench_device_transfers [--device sim|cuda] [--backend thread|nccl] [--steps S] CONFIG...
#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/device_counters.h"
#include "train/config.h"
#include "data/dataset.h"
#include "train/trainer.h"

using namespace vqddp;

int main(int argc, char** argv) {
  std::string device = "sim", backend;
  int64_t steps = 60;
  std::vector<std::string> configs;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
    else if (!std::strcmp(argv[i], "--backend") && i + 1 < argc) backend = argv[++i];
    else if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::stoll(argv[++i]);
    else configs.push_back(argv[i]);
  }
  if (device == "cuda" && cuda_device_count() == 0) {
    fmt::print("device_transfers: no CUDA device; nothing measured\n");
    return 0;
  }
  const int64_t log_every = 20;
  for (const std::string& path : configs) {
    Config cfg = load_config(path);
    cfg.run.device = device;
    if (!backend.empty()) cfg.distributed.backend = backend;
    cfg.run.dir = (std::filesystem::temp_directory_path() / "vqddp-device-transfers").string();
    cfg.schedule.steps = steps;
    cfg.schedule.log_every = log_every;
    Dataset data = load_dataset(cfg.data);
    std::vector<DeviceCounters> per_step;  // rank 0's, one per step interval
    std::mutex mu;
    TrainOptions o;
    o.print = o.validate = o.checkpoints = false;
    o.after_step = [&](const StepView& v) {
      if (v.rank != 0) return;
      per_step.push_back(device_counters());
      reset_device_counters();
    };
    auto start = std::chrono::steady_clock::now();
    train(cfg, data, o);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // Interval s holds step s + 1 (0-based s) and, when step s logged, its log.
    DeviceCounters plain, logged;
    int64_t n_plain = 0, n_logged = 0;
    for (size_t s = 2; s < per_step.size(); ++s) {  // past set-up and k-means init
      bool after_log = s % log_every == 0;
      (after_log ? logged : plain) = (after_log ? logged : plain) + per_step[s];
      ++(after_log ? n_logged : n_plain);
    }
    auto per = [](int64_t v, int64_t n) { return n ? static_cast<double>(v) / n : 0.0; };
    fmt::print("{} on {}, {} backend ({} steps, {:.1f} steps/s incl. set-up):\n",
               std::filesystem::path(path).filename().string(), device, cfg.distributed.backend, steps, steps / secs);
    fmt::print("  per step:     {:.2f} reads, {:.2f} waits, {:.2f} uploads; staging of collectives: {:.2f} reads, "
               "{:.2f} uploads\n",
               per(plain.to_host, n_plain), per(plain.waits, n_plain), per(plain.to_device, n_plain),
               per(plain.staged_to_host, n_plain), per(plain.staged_to_device, n_plain));
    fmt::print("  per step:     {:.1f} launches, {:.1f} kB of layout copies\n", per(plain.launches, n_plain),
               per(plain.layout_bytes, n_plain) / 1e3);
    fmt::print("  per log step: {:.2f} reads, {:.2f} waits (extra over a step: {:.2f})\n", per(logged.to_host, n_logged),
               per(logged.waits, n_logged), per(logged.to_host, n_logged) - per(plain.to_host, n_plain));
  }
  return 0;
}
