#include "train/discriminators.h"

#include <fmt/format.h>

#include <cmath>

#include "engine/core/streams.h"
#include "engine/ops.h"

namespace vqddp {

namespace {

constexpr float kPeriodSlope = 0.1f;  // HiFi-GAN's LeakyReLU
constexpr float kStftSlope = 0.2f;    // EnCodec's

std::shared_ptr<Conv2d> conv(int64_t in, int64_t out, std::array<int64_t, 2> kernel, Generator& gen,
                             std::array<int64_t, 2> stride, std::array<int64_t, 2> padding,
                             std::array<int64_t, 2> dilation = {1, 1}) {
  ConvOptions o;
  o.stride = stride;
  o.padding = padding;
  o.dilation = dilation;
  return std::make_shared<Conv2d>(in, out, kernel, gen, o, ConvLayerOptions{.weight_norm = true, .bias = true});
}

// Every conv then leaky_relu, each activation a feature map; the post conv's
// output the logits.
DiscriminatorOutput run_stack(Tensor h, const std::vector<std::shared_ptr<Conv2d>>& convs, Conv2d& post, float slope) {
  DiscriminatorOutput out;
  for (const auto& c : convs) {
    h = leaky_relu(c->forward(h), slope);
    out.features.push_back(h);
  }
  out.logits = post.forward(h);
  return out;
}

}  // namespace

PeriodDiscriminator::PeriodDiscriminator(int64_t period, const std::vector<int64_t>& channels, Generator& gen)
    : period_(period) {
  int64_t in = 1;
  for (int64_t c : channels) {
    convs_.push_back(register_module(fmt::format("conv{}", convs_.size()), conv(in, c, {5, 1}, gen, {3, 1}, {2, 0})));
    in = c;
  }
  convs_.push_back(register_module(fmt::format("conv{}", convs_.size()), conv(in, in, {5, 1}, gen, {1, 1}, {2, 0})));
  post_ = register_module("post", conv(in, 1, {3, 1}, gen, {1, 1}, {1, 0}));
}

DiscriminatorOutput PeriodDiscriminator::forward(const Tensor& x) {
  const int64_t n = x.size(0), length = x.size(1), pad = (period_ - length % period_) % period_;
  // HiFi-GAN pads by reflection; zeros need no gather and train alike.
  Tensor h = pad > 0 ? concat({x, zeros({n, pad}, DType::f32, x.device())}, 1) : x;
  return run_stack(reshape(h, {n, 1, (length + pad) / period_, period_}), convs_, *post_, kPeriodSlope);
}

StftDiscriminator::StftDiscriminator(int64_t n_fft, int64_t filters, Generator& gen) : stft_(n_fft, n_fft / 4) {
  convs_.push_back(register_module("conv0", conv(2, filters, {9, 3}, gen, {1, 1}, {4, 1})));
  for (int64_t d : {1, 2, 4})
    convs_.push_back(
        register_module(fmt::format("conv{}", convs_.size()), conv(filters, filters, {9, 3}, gen, {2, 1}, {4, d}, {1, d})));
  convs_.push_back(register_module(fmt::format("conv{}", convs_.size()), conv(filters, filters, {3, 3}, gen, {1, 1}, {1, 1})));
  post_ = register_module("post", conv(filters, 1, {3, 3}, gen, {1, 1}, {1, 1}));
}

DiscriminatorOutput StftDiscriminator::forward(const Tensor& x) {
  return run_stack(stft_.complex(x), convs_, *post_, kStftSlope);  // on [N, 2, bins, frames]
}

std::vector<int64_t> default_stft_windows(double sample_rate) {
  std::vector<int64_t> out;
  for (double at24k : {2048.0, 1024.0, 512.0}) {
    double n = at24k * sample_rate / 24000.0;
    const int64_t w = std::max<int64_t>(16, int64_t{1} << static_cast<int>(std::lround(std::log2(std::max(n, 1.0)))));
    // At a low rate several scales round to the 16-sample floor: one
    // discriminator per window, as a config may list it.
    if (out.empty() || out.back() != w) out.push_back(w);
  }
  return out;
}

Discriminators::Discriminators(const GanConfig& gan, int64_t example_length, double sample_rate, uint64_t seed) {
  Generator gen(seed, streams::kDiscriminatorInit);
  for (int64_t p : gan.periods) {
    VQDDP_CHECK(p <= example_length, "gan.periods: period {} is longer than an example ({} samples)", p,
                example_length);
    periods_.push_back(register_module(fmt::format("period{}", p), std::make_shared<PeriodDiscriminator>(p, gan.period_channels, gen)));
  }
  const std::vector<int64_t> windows = gan.stft_windows_given ? gan.stft_windows : default_stft_windows(sample_rate);
  for (int64_t w : windows) {
    VQDDP_CHECK(w <= example_length, "gan.stft_windows: window {} is longer than an example ({} samples, data.frame)",
                w, example_length);
    stfts_.push_back(register_module(fmt::format("stft{}", w), std::make_shared<StftDiscriminator>(w, gan.stft_filters, gen)));
  }
}

std::vector<DiscriminatorOutput> Discriminators::forward(const Tensor& x) {
  std::vector<DiscriminatorOutput> out;
  for (auto& d : periods_) out.push_back(d->forward(x));
  for (auto& d : stfts_) out.push_back(d->forward(x));
  return out;
}

}  // namespace vqddp
