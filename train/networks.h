// The encoder/decoder pairs of the model types (train/model.h), each with
// how its latent becomes tokens:
//
//   mlp:        x [N, F] -> MLP -> [N, tokens * D]; token t of example n is
//               its t-th D-slice (row n * tokens + t).
//   conv_codec: x [N, F] as one channel [N, 1, F] -> Conv1d stack -> [N, D,
//               F / prod(strides)]; each latent frame is a token.
//   conv_vqvae: x [N, S*S] as [N, 1, S, S] -> Conv2d stack -> [N, D, S/4,
//               S/4]; each grid cell is a token.
// The conv types' latents are channels-first; the model moves D last for
// the quantizer and back for the decoder.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "engine/nn.h"
#include "engine/core/random.h"
#include "train/config.h"

namespace vqddp {

struct Network {
  std::shared_ptr<Sequential> encoder, decoder;
  Shape input;   // one example as the encoder takes it: {F} (mlp), {1, F}, {1, S, S}
  Shape latent;  // one example's encoder output: {tokens * D} (mlp), {D, T}, {D, S/4, S/4}
  int64_t tokens = 0;       // per example
  bool channels_first = false;  // latent is [D, positions...] (the conv types)
};

// What is wrong with the keys that depend on model.type (channels and
// strides for the conv types, spectral_weight for conv_codec only), as
// {key, why}, or {"", ""} when they fit: the one rule, which the config
// reader reports naming the key and make_network throws for a ModelConfig
// built in code.
std::pair<std::string, std::string> model_config_problem(const ModelConfig& m);

// Builds the model.type's network for examples of `input_dim` values,
// drawing initial weights from `gen`; a size that does not fit (a frame not
// divisible by the strides, an image that is not a square of a multiple of
// 4) is an error naming the key.
Network make_network(const ModelConfig& m, int64_t input_dim, Generator& gen);

}  // namespace vqddp
