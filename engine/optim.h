// Optimizers: SGD with momentum, AdamW, and gradient-norm clipping.
//
// Updates are written in place into the parameters' storage, so every
// handle to a parameter (the module's member, the DDP wrapper's list, the
// checkpoint writer's list) sees the new values. Parameters whose .grad is
// undefined are skipped, as in PyTorch. Optimizer state is exposed as named
// tensors so a checkpoint can store and restore it exactly.
//
// Parameters may live on any device: each one's state is created next to
// it (step counters stay on the host), and a device runs the CPU's update
// formula (kernel_math.h) with the same rounding, so it gets the same bits.
#pragma once

#include <vector>

#include "engine/nn.h"

namespace vqddp {

class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> params);
  virtual ~Optimizer() = default;
  virtual void step() = 0;
  void zero_grad();
  // Named state tensors ("exp_avg.3", "step.3", ...), live handles: copying
  // values into them restores the optimizer exactly.
  virtual NamedTensors state() = 0;
  // The values state() tensors may hold where more is known than "finite"
  // (step counters >= 0, flags 0/1): checked when a checkpoint restores
  // them, next to the code that relies on them (engine/nn.h, ValueRange).
  virtual NamedRanges state_ranges() const = 0;
  float lr = 0.f;

 protected:
  std::vector<Tensor> params_;
};

struct SgdOptions {
  float lr = 0.01f;
  float momentum = 0.f;
  float weight_decay = 0.f;  // L2 added to the gradient (classic SGD form)
  bool nesterov = false;
};

// buf = momentum * buf + grad (buf = grad on the first step);
// p -= lr * (nesterov ? grad + momentum * buf : buf).
class Sgd : public Optimizer {
 public:
  Sgd(std::vector<Tensor> params, SgdOptions options);
  void step() override;
  NamedTensors state() override;
  NamedRanges state_ranges() const override;

 private:
  SgdOptions opt_;
  std::vector<Tensor> momentum_;  // (param shape) each
  Tensor started_;                // int64 [1]: 1 once the buffers hold a value
};

struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;
};

// Loshchilov & Hutter's decoupled weight decay: p -= lr * wd * p, then the
// bias-corrected Adam step p -= lr * m_hat / (sqrt(v_hat) + eps).
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options);
  void step() override;
  NamedTensors state() override;
  NamedRanges state_ranges() const override;

 private:
  AdamWOptions opt_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
  std::vector<Tensor> steps_;  // int64 [1] per parameter
};

// Scales all gradients so their joint L2 norm is at most max_norm; returns
// the norm before clipping as a float32 scalar on the gradients' device
// (computed in double over every element; on a GPU in another order, so it
// may differ from the CPU's in the last bits). Nothing is read back: the
// decision to scale is made on the device, so a step never waits for it.
Tensor clip_grad_norm(const std::vector<Tensor>& params, float max_norm);

}  // namespace vqddp
