// The parts a run trains: each a module and the optimizer that updates it.
// A run trains a list of them: the codec first (prefix ""), then, in a GAN
// run, the discriminators (prefix "discriminator."; train/gan.h GanPart).
// Everything that must see every trained tensor iterates over the list:
// checkpoints write and read each part's tensors under its prefix, in list
// order (train/checkpoint.h), `vqddp check-ddp` compares all of them after
// every step, the start broadcasts them all from rank 0, and the trainer's
// after_step hook is handed the list (train/trainer.h StepView). A new
// trained part (a teacher, an EMA copy) is one more entry.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "engine/nn.h"
#include "engine/optim.h"
#include "train/config.h"

namespace vqddp {

struct TrainedPart {
  std::string name;    // in messages: "codec", "discriminators"
  std::string prefix;  // its tensors' names in a checkpoint begin with it: prefix + "param.", "buffer.", "optim."
  Module& module;
  Optimizer& optim;
};

// A run of the codec alone (what tests and tools that save or compare a
// codec's state pass where a run's list is asked for).
inline std::vector<TrainedPart> codec_part(Module& codec, Optimizer& optim) {
  return {TrainedPart{"codec", "", codec, optim}};
}

// The optimizer a config names (adamw or sgd), over `params`.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, std::vector<Tensor> params);

// One update of a part at training step `step` (counted from 0) of
// `total_steps`, its gradients the global batch's: the learning rate of
// the step (train/schedule.h), clipping by global norm (config.grad_clip > 0),
// the optimizer's step, gradients zeroed. The codec's and the
// discriminators' updates are this one function; under --profile its two
// phases are marked "step: NAME clipping" and "step: NAME optimizer".
void update_part(const std::string& name, Optimizer& optim, const std::vector<Tensor>& params,
                 const OptimizerConfig& config, int64_t step, int64_t total_steps);

// Collective: every rank must call it, the same parts in the same order.
// Every part's parameters and buffers become rank 0's (train/ddp.h
// broadcast_parameters), as a run's start needs.
void broadcast_parts(std::span<const TrainedPart> parts, Communicator& comm);

}  // namespace vqddp
