// The discriminators of adversarial codec training (train/gan.h): ordinary
// engine modules, so they train, checkpoint and run on every device like the
// codec, and their gradients are exact under data parallelism like its own.
//
//   PeriodDiscriminator (HiFi-GAN, DAC): x [N, L] zero-padded to a multiple
//     of the period p and viewed as [N, 1, L / p, p], so each column is every
//     p-th sample; 2-D convs (5, 1) with stride (3, 1) through the channels
//     given, one more (5, 1) at the last width, then (3, 1) to one channel.
//   StftDiscriminator (EnCodec's MS-STFT): the complex STFT (n_fft, hop
//     n_fft / 4) as two channels [N, 2, bins, frames]; a (9, 3) conv to
//     `filters`, three (9, 3) convs striding 2 over frequency with dilations
//     1, 2, 4 over time, a (3, 3) conv, then (3, 3) to one channel. EnCodec
//     lays the spectrogram out [time, frequency] with (3, 9) kernels; this is
//     the same network with both axes swapped (no transposed copy).
// Every conv is weight-normalized and followed by leaky_relu (slope 0.1 for
// the period discriminators as HiFi-GAN, 0.2 for the STFT ones as EnCodec),
// except the last. The widths are the config's: the references' (32 to 1024
// channels) cost far more than the codec on a CPU.
#pragma once

#include <memory>
#include <vector>

#include "engine/nn_conv.h"
#include "train/config.h"
#include "train/spectral.h"

namespace vqddp {

// One discriminator's view of a batch: every hidden layer's activations
// (feature matching compares them) and the last layer's logits, all batched
// [N, ...] with one example per row of dimension 0.
struct DiscriminatorOutput {
  std::vector<Tensor> features;
  Tensor logits;
};

class PeriodDiscriminator : public Module {
 public:
  PeriodDiscriminator(int64_t period, const std::vector<int64_t>& channels, Generator& gen);
  DiscriminatorOutput forward(const Tensor& x);

 private:
  int64_t period_;
  std::vector<std::shared_ptr<Conv2d>> convs_;
  std::shared_ptr<Conv2d> post_;
};

class StftDiscriminator : public Module {
 public:
  StftDiscriminator(int64_t n_fft, int64_t filters, Generator& gen);
  DiscriminatorOutput forward(const Tensor& x);

 private:
  Stft stft_;
  std::vector<std::shared_ptr<Conv2d>> convs_;
  std::shared_ptr<Conv2d> post_;
};

// EnCodec's STFT windows (2048, 1024, 512 at 24 kHz) scaled to
// `sample_rate`, each rounded to a power of two, at least 16; each window
// once (below about 530 Hz the smaller ones both round to 16).
std::vector<int64_t> default_stft_windows(double sample_rate);

// All the discriminators of a "gan" section: the period ones, then the STFT
// ones, with weights drawn from (seed, streams::kDiscriminatorInit).
// Refuses, naming the key, an STFT window longer than the examples.
class Discriminators : public Module {
 public:
  Discriminators(const GanConfig& gan, int64_t example_length, double sample_rate, uint64_t seed);
  // x [N, L] -> one output per discriminator. No collective, in any mode.
  std::vector<DiscriminatorOutput> forward(const Tensor& x);
  size_t size() const { return periods_.size() + stfts_.size(); }

 private:
  std::vector<std::shared_ptr<PeriodDiscriminator>> periods_;
  std::vector<std::shared_ptr<StftDiscriminator>> stfts_;
};

}  // namespace vqddp
