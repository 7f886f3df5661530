#include "vq/rotation_trick.h"

#include "engine/core/error.h"
#include "engine/ops.h"
#include "vq/losses.h"

namespace vqddp {

namespace {

constexpr float kEps = 1e-6f;  // vector-quantize-pytorch's safe_div and l2norm eps
constexpr float kHuge = 3.4e38f;

Tensor row_norms(const Tensor& x) { return vqddp::sqrt(sum(square(x), 1, /*keepdim=*/true)); }  // (M, 1)
Tensor at_least_eps(const Tensor& n) { return clamp(n, kEps, kHuge); }

}  // namespace

Tensor rotate_to(const Tensor& e, const Tensor& q) {
  VQDDP_CHECK(e.dim() == 2 && e.shape() == q.shape(), "rotate_to: expected two [M, d] of one shape, got {} and {}",
              e.desc(), q.desc());
  Tensor e_norm = row_norms(e.detach()), q_norm = row_norms(q.detach());
  Tensor u = div(e.detach(), at_least_eps(e_norm));
  Tensor q_hat = div(q.detach(), at_least_eps(q_norm));
  Tensor sum_uq = add(u, q_hat);
  Tensor w = div(sum_uq, at_least_eps(row_norms(sum_uq)));
  Tensor reflected = sub(e, mul(mul(sum(mul(e, w), 1, true), 2.f), w));  // e - 2 (e.w) w
  Tensor rotated = add(reflected, mul(mul(sum(mul(e, u), 1, true), 2.f), q_hat));
  return mul(rotated, div(q_norm, at_least_eps(e_norm)));
}

Tensor through_quantizer(const Tensor& z, const Tensor& q, bool rotation_trick) {
  return rotation_trick && z.requires_grad() ? rotate_to(z, q) : straight_through(z, q);
}

}  // namespace vqddp
