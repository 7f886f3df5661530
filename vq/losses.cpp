#include "vq/losses.h"

#include "engine/ops.h"

namespace vqddp {

Tensor mean_or_zero(const Tensor& x) { return x.numel() == 0 ? mul(sum(x), 0.f) : mean(x); }

Tensor mse_or_zero(const Tensor& a, const Tensor& b) {
  return a.numel() == 0 ? mul(add(sum(a), sum(b)), 0.f) : mse_loss(a, b);
}

Tensor straight_through(const Tensor& z, const Tensor& q) { return add(z, sub(q, z).detach()); }

Tensor commitment_loss(const Tensor& q, const Tensor& z, float weight) {
  return mul(mse_or_zero(q.detach(), z), weight);
}

Tensor quantization_loss(const Tensor& q, const Tensor& z, float commitment_weight, bool learnable) {
  Tensor loss = commitment_loss(q, z, commitment_weight);
  return learnable ? add(loss, mse_or_zero(q, z.detach())) : loss;
}

}  // namespace vqddp
