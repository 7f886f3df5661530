// The cost of adversarial training per step: the GAN example
// (examples/speech_codec_gan.json, 4 thread ranks) against the same codec
// and losses with its `gan` section removed, and against the main job
// (examples/speech_codec.json: L2 waveform loss, no mel loss), in the same
// process, alternating, each timed from the end of step WARM to the end of
// its last step (the k-means init and the first steps' allocations left
// out), no validation, no checkpoint. Prints steps/s of each (the median of
// REPS) and the GAN step's cost as a multiple of the other two. Run from
// the project root.
// Usage: bench_gan_step [STEPS=200] [REPS=3]
//
// Not a test: it prints medians and asserts nothing about time.
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "data/dataset.h"
#include "tests/engine/tmpdir.h"
#include "train/config.h"
#include "train/trainer.h"

using namespace vqddp;

namespace {

constexpr int64_t kWarm = 20;

struct Run {
  const char* name;
  Config cfg;
  Dataset data;
};

Run load(const char* name, const std::string& path, bool drop_gan, int steps, const std::string& dir) {
  nlohmann::json j = load_config_json(path);
  if (drop_gan) j.erase("gan");
  j["schedule"]["steps"] = steps;
  j["schedule"]["validate_every"] = 0;
  j["run"]["dir"] = dir;
  Config cfg = parse_config(j, path);
  Dataset data = load_dataset(cfg.data);
  return Run{name, std::move(cfg), std::move(data)};
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 200, reps = argc > 2 ? std::atoi(argv[2]) : 3;
  if (steps <= kWarm) {
    fmt::print(stderr, "bench_gan_step: STEPS must exceed {}\n", kWarm);
    return 2;
  }
  test::TempDir dir;
  std::vector<Run> runs;
  runs.push_back(load("GAN (speech_codec_gan.json)", "examples/speech_codec_gan.json", false, steps, dir.file("gan")));
  runs.push_back(load("the same without gan", "examples/speech_codec_gan.json", true, steps, dir.file("plain")));
  runs.push_back(load("main job (speech_codec.json)", "examples/speech_codec.json", false, steps, dir.file("main")));
  std::vector<std::vector<double>> rates(runs.size());
  for (int r = 0; r < reps; ++r)
    for (size_t i = 0; i < runs.size(); ++i) {
      std::chrono::steady_clock::time_point from, to;
      TrainOptions o;
      o.print = false;
      o.checkpoints = false;
      o.validate = false;
      o.overwrite = true;
      o.after_step = [&](const StepView& v) {
        if (v.rank != 0) return;
        if (v.step == kWarm) from = std::chrono::steady_clock::now();
        if (v.step == steps) to = std::chrono::steady_clock::now();
      };
      train(runs[i].cfg, runs[i].data, o);
      rates[i].push_back((steps - kWarm) / std::chrono::duration<double>(to - from).count());
    }
  std::vector<double> med;
  for (size_t i = 0; i < runs.size(); ++i) {
    med.push_back(bench::median(rates[i]));
    fmt::print("{:30} {:6.2f} steps/s (median of {}, steps {}-{})\n", runs[i].name, med[i], reps, kWarm, steps);
  }
  fmt::print("a GAN step costs {:.2f}x a step of the same codec without gan, {:.2f}x a main-job step\n", med[1] / med[0],
             med[2] / med[0]);
}
