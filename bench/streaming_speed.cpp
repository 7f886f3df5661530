// The main job (examples/speech_codec.json, 4 thread ranks) trained on its
// data streamed from the files (the default) against the same rows held in
// memory (every row read once into a table first: the in-memory loader the
// streaming pipeline replaced), in the same process, alternating, each
// STEPS steps with no validation and no checkpoint. Prints steps/s of
// each (the median of REPS) and their ratio. Run from the project root.
// Usage: bench_streaming_speed [STEPS=300] [REPS=3]
#include <fmt/format.h>

#include <chrono>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "data/dataset.h"
#include "tests/engine/tmpdir.h"
#include "train/config.h"
#include "train/trainer.h"

using namespace vqddp;

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 300, reps = argc > 2 ? std::atoi(argv[2]) : 3;
  test::TempDir dir;
  nlohmann::json j = load_config_json("examples/speech_codec.json");
  j["schedule"]["steps"] = steps;
  j["schedule"]["validate_every"] = 0;
  j["run"]["dir"] = dir.file("run");
  Config cfg = parse_config(j, "examples/speech_codec.json");
  const Dataset streamed = load_dataset(cfg.data);
  Dataset memory = streamed;
  for (DataRows& s : memory.sources) s = s.read_range(0, s.rows());
  memory.validation = memory.validation.read_range(0, memory.validation.rows());
  TrainOptions o;
  o.print = false;
  o.checkpoints = false;
  o.validate = false;
  o.overwrite = true;
  auto rate = [&](const Dataset& d) {
    auto t0 = std::chrono::steady_clock::now();
    train(cfg, d, o);
    return steps / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<double> s, m;
  for (int r = 0; r < reps; ++r) {
    m.push_back(rate(memory));
    s.push_back(rate(streamed));
  }
  const double sm = bench::median(s), mm = bench::median(m);
  fmt::print("main job, {} steps, 4 thread ranks: in memory {:.1f} steps/s, streamed {:.1f} steps/s (medians of {})\n",
             steps, mm, sm, reps);
  fmt::print("ratio streamed / in memory: {:.3f}\n", sm / mm);
}
