// A small training run on synthetic frames, shared by the CPU training
// tests and the GPU suite: residual VQ with k-means, revival and dropout,
// so every kind of state is exercised, in a few seconds.
#pragma once

#include <string>

#include "engine/ops.h"
#include "engine/random.h"
#include "train/config.h"
#include "train/dataset.h"
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
      {"schedule", {{"batch_size", 30}, {"epochs", 2}, {"log_every", 1000}}},
      {"distributed", {{"world_size", 3}, {"timeout_s", 5}}},
      {"run", {{"dir", dir}, {"seed", 7}}}};
  if (quantizer_type == "fsq") {
    j["quantizer"] = {{"type", "fsq"}, {"levels", {5, 4, 3, 3}}};
  }
  return parse_config(j, "test");
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

// No progress lines.
inline TrainOptions quiet() {
  TrainOptions o;
  o.print = false;
  return o;
}

}  // namespace vqddp::test
