// A small training run on synthetic frames, shared by the CPU training
// tests and the GPU suite: residual VQ with k-means, revival and dropout,
// so every kind of state is exercised, in a few seconds.
#pragma once

#include <cstdlib>
#include <string>

#include "engine/ops.h"
#include "engine/core/safetensors.h"
#include "tests/vq/harness.h"
#include "engine/core/random.h"
#include "train/config.h"
#include "data/dataset.h"
#include "train/trainer.h"

namespace vqddp::test {

inline Config small_config(const std::string& dir, const std::string& quantizer_type = "residual_vq") {
  nlohmann::json j = {
      {"model", {{"hidden", 32}, {"hidden_layers", 1}, {"latent_dim", 4}}},
      {"quantizer",
       {{"type", quantizer_type}, {"num_quantizers", 3}, {"codebook_size", 16}, {"decay", 0.9},
        {"threshold_ema_dead_code", 1.0}, {"kmeans_iters", 3}, {"quantize_dropout", true},
        {"quantize_dropout_cutoff_index", 0}}},
      {"data", {{"type", "wav_frames"}, {"sources", {{{"path", "unused"}}}}}},
      {"optimizer", {{"lr", 0.003}}},
      {"schedule", {{"batch_size", 30}, {"epochs", 2}, {"log_every", 3}, {"validate_every", 4}}},  // mid-run log and validation collectives run too
      {"distributed", {{"world_size", 3}, {"timeout_s", 5}}},
      {"run", {{"dir", dir}, {"seed", 7}}}};
  if (quantizer_type == "fsq") {
    j["quantizer"] = {{"type", "fsq"}, {"levels", {5, 4, 3, 3}}};
  }
  return parse_config(j, "test");
}

// cfg's quantizer section with `keys` set (a new type starts from that
// type's defaults), read as parse_config reads it; cfg.source follows.
inline void set_quantizer_keys(Config& cfg, const nlohmann::json& keys) {
  nlohmann::json q = cfg.source.is_object() ? cfg.source.value("quantizer", nlohmann::json::object())
                                            : nlohmann::json::object();
  for (const auto& [key, value] : keys.items()) q[key] = value;
  cfg.quantizer = parse_quantizer_options(q, cfg.model.latent_dim, "test quantizer");
  cfg.source["quantizer"] = q;
}

// Two weighted sources of 70 and 35 frames of 16 samples, 20 for validation.
inline Dataset synthetic_data(int64_t f = 16) {
  Generator g(3, 0);
  Dataset d;
  d.sources = {rand_normal({70, f}, g), mul(rand_normal({35, f}, g), 0.5f)};
  d.weights = {2.0, 1.0};
  d.validation = rand_normal({20, f}, g);
  d.example_dim = f;
  d.description = "synthetic";
  return d;
}

// Whether this is a sanitized build (VQDDP_TEST_SANITIZED=1, set by
// tests/meson.build): its longest cases run fewer settings.
inline bool sanitized_build() {
  const char* v = std::getenv("VQDDP_TEST_SANITIZED");
  return v && std::string(v) == "1";
}

// No progress lines.
inline TrainOptions quiet() {
  TrainOptions o;
  o.print = false;
  return o;
}

// Bit-exact resume: `cfg` trained for `steps` straight (in dir_a) must end
// bitwise equal to the same run stopped at steps / 2 and resumed (in
// dir_b), and the resumed run must take exactly the remaining steps (a
// resume that ignored its checkpoint would retrain from step 0 and end in
// the same bits). Returns the resumed run's result.
inline TrainResult check_bit_exact_resume(Config cfg, const Dataset& data, const std::string& dir_a,
                                          const std::string& dir_b, int64_t steps) {
  cfg.schedule.steps = steps;
  cfg.run.dir = dir_a;
  train(cfg, data, quiet());
  cfg.run.dir = dir_b;
  TrainOptions first = quiet();
  first.stop_at_step = steps / 2;
  train(cfg, data, first);
  std::string ckpt = dir_b + "/checkpoint.safetensors";
  CHECK(safetensors_load(ckpt).at("train.step").item<int64_t>() == steps / 2);
  TrainOptions second = quiet();
  second.resume = ckpt;
  std::vector<int64_t> done_steps;  // rank 0's
  second.after_step = [&](const StepView& v) {
    if (v.rank == 0) done_steps.push_back(v.step);
  };
  TrainResult r = train(cfg, data, second);
  CHECK(r.steps == steps);
  REQUIRE(done_steps.size() == static_cast<size_t>(steps - steps / 2));
  CHECK(done_steps.front() == steps / 2 + 1);
  NamedTensors a = safetensors_load(dir_a + "/checkpoint.safetensors").tensors, b = safetensors_load(ckpt).tensors;
  REQUIRE(a.size() > 10);
  CHECK(bitwise_equal(a, b));
  return r;
}

}  // namespace vqddp::test
