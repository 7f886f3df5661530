#include "vq/losses.h"

#include "engine/autograd.h"

#include "comm/batch_reduce.h"
#include "engine/exact_batch.h"
#include "engine/ops.h"

namespace vqddp {

Tensor global_mean_or_zero(const Tensor& x, Communicator& comm) { return batch_mean(x, comm); }

Tensor global_mse_or_zero(const Tensor& a, const Tensor& b, Communicator& comm) {
  if (exact_batch()) return batch_mean(square(sub(a, b)), comm);
  return a.numel() == 0 ? mul(add(sum(a), sum(b)), 0.f) : mse_loss(a, b);
}

Tensor global_row_mean(const Tensor& p, Communicator& comm) {
  const int64_t n = p.size(0), k = p.size(1);
  Tensor global = batch_sum(concat({p, full({n, 1}, 1.0, DType::f32, p.device())}, 1), comm);  // (K + 1)
  // The global row count (identical on every rank) stays on the device.
  Tensor rows = clamp(slice_rows(global.detach(), k, k + 1), 1.f, 3.4e38f);
  return div(slice_rows(global, 0, k), rows);
}

// Where z carries no gradient (eval, no grad, an input without one) the
// value is q itself, detached as the sum would be: z + (q - z) in float is q
// only up to rounding, and inference (decode from codes) must give the bits
// of the eval forward.
Tensor straight_through(const Tensor& z, const Tensor& q) {
  if (!z.requires_grad() || !grad_enabled()) return q.detach();
  return add(z, sub(q, z).detach());
}

Tensor commitment_loss(const Tensor& q, const Tensor& z, float weight, Communicator& comm) {
  return mul(global_mse_or_zero(q.detach(), z, comm), weight);
}

Tensor quantization_loss(const Tensor& q, const Tensor& z, float commitment_weight, bool learnable,
                         Communicator& comm) {
  Tensor loss = commitment_loss(q, z, commitment_weight, comm);
  return learnable ? add(loss, global_mse_or_zero(q, z.detach(), comm)) : loss;
}

}  // namespace vqddp
