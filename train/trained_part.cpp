#include "train/trained_part.h"

#include "engine/op_profile.h"
#include "train/ddp.h"
#include "train/schedule.h"

namespace vqddp {

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& o, std::vector<Tensor> params) {
  if (o.type == "sgd") return std::make_unique<Sgd>(std::move(params), SgdOptions{o.lr, o.momentum, o.weight_decay, false});
  return std::make_unique<AdamW>(std::move(params), AdamWOptions{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay});
}

void update_part(const std::string& name, Optimizer& optim, const std::vector<Tensor>& params,
                 const OptimizerConfig& config, int64_t step, int64_t total_steps) {
  // The marks' names are built only under --profile: this runs every step.
  const bool profiled = op_profile_enabled();
  optim.lr = learning_rate(config, step, total_steps);
  if (config.grad_clip > 0) clip_grad_norm(params, config.grad_clip);
  if (profiled) op_profile_mark("step: " + name + " clipping");
  optim.step();
  optim.zero_grad();
  if (profiled) op_profile_mark("step: " + name + " optimizer");
}

void broadcast_parts(std::span<const TrainedPart> parts, Communicator& comm) {
  for (const TrainedPart& part : parts) broadcast_parameters(part.module, comm);
}

}  // namespace vqddp
