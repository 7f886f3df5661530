#include "train/networks.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <fmt/format.h>

#include "engine/core/count_limits.h"
#include "engine/core/error.h"
#include "engine/nn_conv.h"
#include "engine/ops.h"

namespace vqddp {

namespace {

std::shared_ptr<Layer> activation(const std::string& name) {
  auto fn = [](auto f) { return std::make_shared<Activation>(f); };
  if (name == "relu") return fn([](const Tensor& t) { return relu(t); });
  if (name == "tanh") return fn([](const Tensor& t) { return vqddp::tanh(t); });
  if (name == "elu") return fn([](const Tensor& t) { return elu(t); });
  if (name == "leaky_relu") return fn([](const Tensor& t) { return leaky_relu(t, 0.1f); });  // DAC/HiFi-GAN's slope
  if (name == "silu") return fn([](const Tensor& t) { return silu(t); });
  return fn([](const Tensor& t) { return gelu(t); });
}

std::shared_ptr<Sequential> mlp(int64_t in, int64_t hidden, int layers, int64_t out, const std::string& act,
                                Generator& gen) {
  auto net = std::make_shared<Sequential>();
  int64_t width = in;
  for (int i = 0; i < layers; ++i) {
    net->add(std::make_shared<Linear>(width, hidden, gen)).add(activation(act));
    width = hidden;
  }
  net->add(std::make_shared<Linear>(width, out, gen));
  return net;
}

Network mlp_network(const ModelConfig& m, int64_t input_dim, Generator& gen) {
  Network n;
  int64_t latent = m.tokens * m.latent_dim;
  n.encoder = mlp(input_dim, m.hidden, m.hidden_layers, latent, m.activation, gen);
  n.decoder = mlp(latent, m.hidden, m.hidden_layers, input_dim, m.activation, gen);
  n.input = {input_dim};
  n.latent = {latent};
  n.tokens = m.tokens;
  return n;
}

// ---- conv_codec ------------------------------------------------------------------
// SoundStream's encoder block: residual units act -> Conv1d(k 3, dilation
// d) -> act -> Conv1d(k 1) with d = 1, 3, 9, ..., then act -> a Conv1d of
// kernel 2s and stride s, which maps length L (a multiple of s) to exactly
// L / s. The decoder mirrors it with ConvTranspose1d(k 2s, stride s):
// L -> L s.
//
// Non-causal (the default): symmetric padding, the codec sees a whole
// segment; a stride-s layer pads ceil(s/2) and its transposed mirror takes
// output_padding 2 ceil(s/2) - s. Causal (model.causal): every layer pads
// on the left only and a transposed layer cuts its overhang on the right
// (Conv1dOptions::causal), so a latent frame depends on the samples up to
// its last one and a decoded sample on the frames up to its own: the
// codec can code a stream as it arrives.

// Padding of a stride-s layer of kernel 2s: L -> L / s down, L -> L s up.
int64_t stride_padding(int64_t s) { return (s + 1) / 2; }

struct Conv1dMaker {
  Generator& gen;
  ConvLayerOptions layer;
  bool causal;
  // A stride-1 convolution of kernel k (odd) and dilation d: length kept.
  std::shared_ptr<Layer> operator()(int64_t in, int64_t out, int64_t k, int64_t d = 1) const {
    Conv1dOptions o{.padding = causal ? 0 : d * (k - 1) / 2, .dilation = d, .causal = causal};
    return std::make_shared<Conv1d>(in, out, k, gen, o, layer);
  }
  // Kernel 2s, stride s: L -> L / s.
  std::shared_ptr<Layer> down(int64_t in, int64_t out, int64_t s) const {
    Conv1dOptions o{.stride = s, .padding = causal ? 0 : stride_padding(s), .causal = causal};
    return std::make_shared<Conv1d>(in, out, 2 * s, gen, o, layer);
  }
  // Its mirror: L -> L s.
  std::shared_ptr<Layer> up(int64_t in, int64_t out, int64_t s) const {
    const int64_t pad = causal ? 0 : stride_padding(s);
    Conv1dOptions o{.stride = s, .padding = pad, .output_padding = causal ? 0 : 2 * pad - s, .causal = causal};
    return std::make_shared<ConvTranspose1d>(in, out, 2 * s, gen, o, layer);
  }
};

void residual_units(Sequential& net, const ModelConfig& m, int64_t ch, const Conv1dMaker& conv) {
  int64_t dilation = 1;
  for (int64_t u = 0; u < m.residual_units; ++u, dilation *= 3) {
    auto unit = std::make_shared<Sequential>();
    unit->add(activation(m.activation))
        .add(conv(ch, ch, 3, dilation))
        .add(activation(m.activation))
        .add(conv(ch, ch, 1));
    net.add(std::make_shared<Residual>(unit));
  }
}

Network conv_codec_network(const ModelConfig& m, int64_t input_dim, Generator& gen) {
  int64_t hop = *limits::product(m.strides);  // bounded by model_config_problem
  VQDDP_CHECK(input_dim % hop == 0, "data.frame {} must be a multiple of the product of model.strides ({}) for "
              "conv_codec: each token covers that many samples", input_dim, hop);
  Conv1dMaker conv{gen, {.weight_norm = m.weight_norm, .bias = true}, m.causal};
  const std::vector<int64_t>& ch = m.channels;
  size_t stages = m.strides.size();
  Network n;
  n.encoder = std::make_shared<Sequential>();
  n.encoder->add(conv(1, ch[0], 7));
  for (size_t i = 0; i < stages; ++i) {
    residual_units(*n.encoder, m, ch[i], conv);
    n.encoder->add(activation(m.activation)).add(conv.down(ch[i], ch[i + 1], m.strides[i]));
  }
  n.encoder->add(activation(m.activation)).add(conv(ch[stages], m.latent_dim, 3));

  n.decoder = std::make_shared<Sequential>();
  n.decoder->add(conv(m.latent_dim, ch[stages], 7));
  for (size_t i = stages; i-- > 0;) {
    n.decoder->add(activation(m.activation)).add(conv.up(ch[i + 1], ch[i], m.strides[i]));
    residual_units(*n.decoder, m, ch[i], conv);
  }
  n.decoder->add(activation(m.activation)).add(conv(ch[0], 1, 7));
  n.input = {1, input_dim};
  n.latent = {m.latent_dim, input_dim / hop};
  n.tokens = input_dim / hop;
  n.channels_first = true;
  return n;
}

// ---- conv_vqvae ------------------------------------------------------------------
// The VQ-VAE paper's shape: two Conv2d(k 4, stride 2, padding 1) halve the
// image twice (28 -> 14 -> 7), a Conv2d(k 3) maps to D; the decoder mirrors
// it with ConvTranspose2d(k 4, stride 2, padding 1), which doubles exactly.
Network conv_vqvae_network(const ModelConfig& m, int64_t input_dim, Generator& gen) {
  auto side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(input_dim))));
  VQDDP_CHECK(side * side == input_dim && side % 4 == 0, "conv_vqvae needs square images with a side divisible by 4 "
              "(28 x 28 for Fashion-MNIST); the data has {} values per example", input_dim);
  ConvLayerOptions layer{.weight_norm = m.weight_norm, .bias = true};
  ConvOptions half;
  half.stride = {2, 2};
  half.padding = {1, 1};
  ConvOptions same;
  same.padding = {1, 1};
  int64_t c0 = m.channels[0], c1 = m.channels[1];
  Network n;
  n.encoder = std::make_shared<Sequential>();
  n.encoder->add(std::make_shared<Conv2d>(1, c0, 4, gen, half, layer))
      .add(activation(m.activation))
      .add(std::make_shared<Conv2d>(c0, c1, 4, gen, half, layer))
      .add(activation(m.activation))
      .add(std::make_shared<Conv2d>(c1, m.latent_dim, 3, gen, same, layer));
  n.decoder = std::make_shared<Sequential>();
  n.decoder->add(std::make_shared<Conv2d>(m.latent_dim, c1, 3, gen, same, layer))
      .add(activation(m.activation))
      .add(std::make_shared<ConvTranspose2d>(c1, c0, 4, gen, half, layer))
      .add(activation(m.activation))
      .add(std::make_shared<ConvTranspose2d>(c0, 1, 4, gen, half, layer));
  n.input = {1, side, side};
  n.latent = {m.latent_dim, side / 4, side / 4};
  n.tokens = (side / 4) * (side / 4);
  n.channels_first = true;
  return n;
}

}  // namespace

std::pair<std::string, std::string> model_config_problem(const ModelConfig& m) {
  if (m.type == "conv_codec") {
    if (m.strides.empty() || m.channels.size() != m.strides.size() + 1)
      return {"channels", fmt::format("needs one entry more than strides for conv_codec ({} channels, {} strides)",
                                      m.channels.size(), m.strides.size())};
    std::optional<int64_t> hop = limits::product(m.strides);
    if (std::any_of(m.strides.begin(), m.strides.end(), [](int64_t s) { return s < 1; }) || !hop ||
        *hop > limits::frame.hi)
      return {"strides", fmt::format("must be positive with a product (samples per token) of at most {}, the "
                                     "largest data.frame", limits::frame.hi)};
  }
  if (m.type == "conv_vqvae" && m.channels.size() != 2)
    return {"channels", "needs two entries for conv_vqvae (its two stages)"};
  if (!(m.spectral_weight >= 0)) return {"spectral_weight", "must be at least 0"};
  if (!(m.mel_weight >= 0)) return {"mel_weight", "must be at least 0"};
  if (!(m.stoi_weight >= 0)) return {"stoi_weight", "must be at least 0"};
  if (m.stoi_weight > 0 && m.type != "conv_codec")
    return {"stoi_weight", fmt::format("applies to conv_codec only (a band-envelope loss on audio), not {}", m.type)};
  if (m.mel_weight > 0 && m.type != "conv_codec")
    return {"mel_weight", fmt::format("applies to conv_codec only (a log-mel loss on audio), not {}", m.type)};
  if (m.spectral_weight > 0 && m.type != "conv_codec")
    return {"spectral_weight", fmt::format("applies to conv_codec only (an STFT loss on audio), not {}", m.type)};
  return {};
}

Network make_network(const ModelConfig& m, int64_t input_dim, Generator& gen) {
  auto [key, why] = model_config_problem(m);
  VQDDP_CHECK(key.empty(), "model.{} {}", key, why);
  if (m.type == "conv_codec") return conv_codec_network(m, input_dim, gen);
  if (m.type == "conv_vqvae") return conv_vqvae_network(m, input_dim, gen);
  return mlp_network(m, input_dim, gen);
}

}  // namespace vqddp
