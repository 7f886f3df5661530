#include "vq/losses.h"

#include "comm/batch_reduce.h"
#include "engine/exact_batch.h"
#include "engine/ops.h"

namespace vqddp {

Tensor mean_or_zero(const Tensor& x, Communicator& comm) { return batch_mean(x, comm); }

Tensor mse_or_zero(const Tensor& a, const Tensor& b, Communicator& comm) {
  if (exact_batch()) return batch_mean(square(sub(a, b)), comm);
  return a.numel() == 0 ? mul(add(sum(a), sum(b)), 0.f) : mse_loss(a, b);
}

Tensor straight_through(const Tensor& z, const Tensor& q) { return add(z, sub(q, z).detach()); }

Tensor commitment_loss(const Tensor& q, const Tensor& z, float weight, Communicator& comm) {
  return mul(mse_or_zero(q.detach(), z, comm), weight);
}

Tensor quantization_loss(const Tensor& q, const Tensor& z, float commitment_weight, bool learnable,
                         Communicator& comm) {
  Tensor loss = commitment_loss(q, z, commitment_weight, comm);
  return learnable ? add(loss, mse_or_zero(q, z.detach(), comm)) : loss;
}

}  // namespace vqddp
