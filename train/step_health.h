// What a training step leaves to be read: its losses and code usage for a
// progress line (step_log), and whether every loss stayed finite
// (StepHealth), read only where the run logs, validates or checkpoints, so
// a step on a device never waits for it and a diverged model is never
// written.
//
// Internal header: not installed with the library (the trainer's step).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "train/model.h"
#include "train/trainer.h"

namespace vqddp {

// What a progress line shows, from the last step of a logging interval.
struct StepLog {
  double loss = 0, recon = 0, quantizer = 0;  // means over the global batch
  std::optional<double> discriminator, adversarial, feature;  // a GAN step's (train/gan.h)
  int64_t revived = 0;
  std::vector<LayerUsage> usage;
};

// Collective: every rank calls it at a logged step. Reads a logged step's
// numbers: the only place a training step waits for the device
// (docs/devices.md, "Transfers"). `adversarial` is a GAN step's
// {adversarial, feature matching[, discriminators]} losses, empty in the
// warm-up and without "gan". See step_health.cpp.
StepLog step_log(const ModelOutput& out, const Tensor& loss, const std::vector<Tensor>& adversarial,
                 const std::vector<int64_t>& sizes, Communicator& comm);

// Where a non-finite value met in the forward pass came from: the batch
// itself, or the model (the first non-finite parameter, if one is).
std::string nonfinite_origin(const Tensor& host_batch, const CodecModel& model);

// 0 while every loss of this rank was finite, NaN from the first one that
// was not (loss - loss is 0 or NaN; the sum keeps a NaN). Kept on the
// device and written in place: a captured step graph replays writes into
// the same buffer.
class StepHealth {
 public:
  explicit StepHealth(Device device);
  void note(const Tensor& loss);
  // Collective: throws on every rank alike when any rank met a non-finite
  // loss in the steps (checked, done]: the ranks' flags are summed, then
  // read (one read). The message names the rank and where the value came
  // from (nonfinite_origin of this rank's last batch).
  void check(Communicator& comm, int64_t checked, int64_t done, const Tensor& host_batch,
             const CodecModel& model) const;

 private:
  Tensor flag_;
};

}  // namespace vqddp
