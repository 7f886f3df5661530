// Peak memory of validation against the held-out set's size: the main job
// (examples/speech_codec.json, 4 thread ranks) trains STEPS steps on a
// fixed corpus of TRAIN clips and validates once at the end on the first H
// of a generated held-out set, for each H given (16-bit WAV at 8 kHz,
// SECONDS each, every clip its own noise), each run in a child process
// whose peak resident set the kernel reports (wait4). Validation is cut in
// chunks (train/validation.cpp), so its memory must not grow with H.
// The child also samples, every 20 ms, its resident set, the CPU block
// cache (engine/core/cpu_allocator.h) and malloc's heap (mallinfo2), and
// says what they held when the resident set peaked. Run from the project
// root; 2,000 clips of 10 s validate in some minutes on 2 cores. Usage:
//   bench_validation_memory [HELD=20,200,2000] [SECONDS=10] [STEPS=20] [TRAIN=200]
#include <fmt/format.h>

#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/child_runs.h"
#include "data/audio_windows.h"
#include "data/dataset.h"
#include "engine/core/cpu_allocator.h"
#include "tests/engine/tmpdir.h"
#include "train/config.h"
#include "train/trainer.h"

using namespace vqddp;

namespace {

double rss_mib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024;
  return 0;
}

// Trains on `train_dir` and validates on the first `held` clips of
// `held_dir` in a child; its peak resident set in MiB and wall seconds.
std::pair<double, double> train_child(const std::string& train_dir, int train_clips, const std::string& held_dir,
                                      int held, const std::string& run_dir, int steps) {
  return bench::in_child([&] {
    nlohmann::json j = load_config_json("examples/speech_codec.json");
    j["data"]["sources"] = {{{"path", train_dir}}};
    // The training corpus's last clip is held out (load_dataset wants
    // one); the validation set is then replaced by the generated one.
    j["data"]["holdout_every"] = train_clips;
    j["data"]["index_dir"] = run_dir + "-index";
    j["schedule"]["steps"] = steps;
    j["schedule"]["validate_every"] = 0;  // once, at the end
    j["run"]["dir"] = run_dir;
    Config cfg = parse_config(j, "examples/speech_codec.json");
    Dataset data = load_dataset(cfg.data);
    std::vector<std::string> paths;
    for (const auto& e : std::filesystem::directory_iterator(held_dir)) paths.push_back(e.path().string());
    std::sort(paths.begin(), paths.end());
    paths.resize(static_cast<size_t>(held));
    std::vector<AudioClip> clips;
    for (const std::string& p : paths) clips.push_back(audio_clip(p));
    data.validation = DataRows(std::make_shared<AudioWindows>(std::move(clips), 8000, cfg.data.frame));
    // What the process held when its resident set peaked.
    std::atomic<bool> done{false};
    double peak = 0, cache = 0, live_peak = 0, heap_used = 0, heap_free = 0;
    std::thread monitor([&] {
      while (!done.load()) {
        const double r = rss_mib();
        if (r > peak) {
          const struct mallinfo2 m = mallinfo2();
          peak = r;
          cache = static_cast<double>(cpu_cache_bytes()) / 1048576;
          live_peak = static_cast<double>(cpu_peak_live_bytes()) / 1048576;
          heap_used = static_cast<double>(m.uordblks + m.hblkhd) / 1048576;
          heap_free = static_cast<double>(m.fordblks) / 1048576;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
    TrainOptions o;
    o.print = false;
    o.overwrite = true;
    train(cfg, data, o);
    done = true;
    monitor.join();
    fmt::print("    at the sampled peak ({:.1f} MiB): CPU block cache {:.1f} MiB, peak of large "
               "blocks in use {:.1f} MiB, malloc in use {:.1f} MiB, free in malloc's heaps {:.1f} MiB\n", peak, cache,
               live_peak, heap_used, heap_free);
  });
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> helds;
  {
    std::stringstream s(argc > 1 ? argv[1] : "20,200,2000");
    for (std::string item; std::getline(s, item, ',');) helds.push_back(std::stoi(item));
  }
  const double seconds = argc > 2 ? std::atof(argv[2]) : 10;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 20;
  const int train_clips = argc > 4 ? std::atoi(argv[4]) : 200;
  if (helds.empty() || *std::min_element(helds.begin(), helds.end()) < 1) {
    fmt::print(stderr, "usage: bench_validation_memory [HELD=20,200,2000] [SECONDS=10] [STEPS=20] [TRAIN=200]\n");
    return 2;
  }
  test::TempDir dir;
  bench::write_corpus(dir.file("train"), train_clips, seconds, 0);
  bench::write_corpus(dir.file("held"), *std::max_element(helds.begin(), helds.end()), seconds, 1000000);
  fmt::print("main job, {} steps on {} clips, 4 thread ranks, then one validation; 16-bit WAV at 8 kHz, {:.0f} s "
             "per clip:\n", steps, train_clips, seconds);
  double base = 0;
  for (int held : helds) {
    const auto [mib, s] = train_child(dir.file("train"), train_clips, dir.file("held"), held, dir.file(fmt::format("run{}", held)), steps);
    if (base == 0) base = mib;
    fmt::print("  {:5} held-out clips: peak RSS {:.1f} MiB ({:.3f}x the first), {:.1f} s\n", held, mib, mib / base, s);
    std::fflush(stdout);
  }
}
