// Peak memory of training on a streamed corpus against its size: the main
// job (examples/speech_codec.json, 4 thread ranks) for a few steps on a
// generated corpus of SMALL files and on one of LARGE files (16-bit WAV at
// 8 kHz, SECONDS each, every file its own noise: 20,000 files of 16 s are
// 5.1 GB), each run in a child process whose peak resident set the kernel
// reports (wait4). Run from the project root. Usage:
//   bench_streaming_memory [SMALL=200] [LARGE=20000] [SECONDS=16] [STEPS=30]
#include <fmt/format.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench/child_runs.h"
#include "data/dataset.h"
#include "tests/engine/tmpdir.h"
#include "train/config.h"
#include "train/trainer.h"

using namespace vqddp;

namespace {

// Trains in a child; its peak resident set in MiB and wall seconds.
std::pair<double, double> train_child(const std::string& corpus, const std::string& run_dir, int steps) {
  return bench::in_child([&] {
    nlohmann::json j = load_config_json("examples/speech_codec.json");
    j["data"]["sources"] = {{{"path", corpus}}};
    j["data"]["index_dir"] = run_dir + "-index";
    j["schedule"]["steps"] = steps;
    j["schedule"]["validate_every"] = 0;
    j["run"]["dir"] = run_dir;
    Config cfg = parse_config(j, "examples/speech_codec.json");
    TrainOptions o;
    o.print = false;
    o.overwrite = true;
    train(cfg, load_dataset(cfg.data), o);
  });
}

}  // namespace

int main(int argc, char** argv) {
  const int small = argc > 1 ? std::atoi(argv[1]) : 200, large = argc > 2 ? std::atoi(argv[2]) : 20000;
  const double seconds = argc > 3 ? std::atof(argv[3]) : 16;
  const int steps = argc > 4 ? std::atoi(argv[4]) : 30;
  test::TempDir dir;
  const double small_gb = bench::write_corpus(dir.file("small"), small, seconds);
  const double large_gb = bench::write_corpus(dir.file("large"), large, seconds);
  const auto [small_mib, small_s] = train_child(dir.file("small"), dir.file("run_small"), steps);
  const auto [large_mib, large_s] = train_child(dir.file("large"), dir.file("run_large"), steps);
  fmt::print("main job, {} steps, 4 thread ranks, streamed 16-bit WAV at 8 kHz ({:.0f} s per file):\n", steps, seconds);
  fmt::print("  {:6} files ({:.2f} GB): peak RSS {:.1f} MiB, {:.1f} s\n", small, small_gb, small_mib, small_s);
  fmt::print("  {:6} files ({:.2f} GB): peak RSS {:.1f} MiB, {:.1f} s\n", large, large_gb, large_mib, large_s);
  fmt::print("ratio of peak RSS, large / small: {:.3f}\n", large_mib / small_mib);
}
