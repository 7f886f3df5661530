// Adversarial training of a waveform codec (the config's "gan" section):
// the losses, and which steps update the discriminators.
//
// A step of a GAN run (train/rank_step.cpp), all of it one exact step:
//   1. the codec's forward: y = codec(x), its reconstruction and quantizer
//      losses;
//   2. past the warm-up, on a step discriminator_updates() picks: the
//      discriminators on x and on y.detach(), discriminator_loss, backward,
//      clipping and the discriminators' optimizer step;
//   3. past the warm-up: the (updated) discriminators on x (no grad) and on
//      y; the codec's loss gains adversarial_weight * generator_loss +
//      feature_weight * feature_matching_loss; backward, clipping and the
//      codec's optimizer step.
// Every mean below is the global batch's (vq/losses.h), so every gradient
// is exact, and every decision reads the step and the seed alone, never a
// loss: all ranks run the same collectives whatever their data.
#pragma once

#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "engine/optim.h"
#include "train/config.h"
#include "train/discriminators.h"
#include "train/trained_part.h"

namespace vqddp {

// Hinge: mean relu(1 - D(x)) + mean relu(1 + D(y)) per discriminator;
// least squares: mean (1 - D(x))^2 + mean D(y)^2. Averaged over the
// discriminators (EnCodec's normalisation).
Tensor discriminator_loss(const std::vector<DiscriminatorOutput>& real, const std::vector<DiscriminatorOutput>& fake,
                          const std::string& kind, Communicator& comm);

// The codec's adversarial loss: hinge mean relu(1 - D(y)) (EnCodec's),
// least squares mean (1 - D(y))^2; averaged over the discriminators.
Tensor generator_loss(const std::vector<DiscriminatorOutput>& fake, const std::string& kind, Communicator& comm);

// Feature matching, EnCodec's relative L1: per hidden layer
// mean |f(y) - f(x)| / mean |f(x)| (the real features detached), summed over
// a discriminator's layers and averaged over the discriminators.
Tensor feature_matching_loss(const std::vector<DiscriminatorOutput>& real,
                             const std::vector<DiscriminatorOutput>& fake, Communicator& comm);

// Whether training step `step` (counted from 1) uses the adversarial losses:
// past gan.warmup_steps.
bool adversarial_step(const GanConfig& gan, int64_t step);
// Whether step `step` updates the discriminators: an adversarial step that
// is a multiple of update_every and wins a draw of probability
// update_probability from (seed, streams::kDiscriminatorUpdate + step).
bool discriminator_updates(const GanConfig& gan, uint64_t seed, int64_t step);

// A GAN run's discriminators as a trained part (train/trained_part.h):
// the module on the run's device, its optimizer, and what steps 2 and 3
// above do with them. Every call belongs inside the step's exact scope
// (engine/exact_batch.h), so the discriminators' gradients are the global
// batch's on every rank.
class GanPart {
 public:
  GanPart(const GanConfig& gan, int64_t example_length, double sample_rate, uint64_t seed, Device device);
  // {"discriminators", "discriminator.", the module, its optimizer}.
  TrainedPart part();

  // Step 2's loss: the discriminators on x and on y (detached).
  Tensor discriminator_loss(const Tensor& x, const Tensor& y, Communicator& comm);
  // Step 2's update from that loss: backward, then update_part at training
  // step `step` (counted from 0) of `total_steps`.
  void learn(const Tensor& loss, int64_t step, int64_t total_steps);

  // Step 3's losses for the codec: the (updated) discriminators on x, with
  // no graph (only the features' scale and targets are needed), and on y,
  // whose gradient reaches the codec alone: their parameters are frozen for
  // this pass, so backward computes no weight gradient for them and reduces
  // none. `total` = adversarial_weight * adversarial + feature_weight * feature.
  struct CodecLosses {
    Tensor adversarial, feature, total;
  };
  CodecLosses codec_losses(const Tensor& x, const Tensor& y, Communicator& comm);

 private:
  GanConfig gan_;
  Discriminators module_;
  std::vector<Tensor> params_;
  std::unique_ptr<Optimizer> optim_;
};

}  // namespace vqddp
