#include "vq/assign.h"

#include "engine/ops.h"
#include "vq/kernels/vq_kernels.h"

namespace vqddp {

Tensor assign_codes(const Tensor& x, const Tensor& embed, bool cosine) {
  VQDDP_CHECK(x.dim() == 2 && embed.dim() == 2 && x.size(1) == embed.size(1),
              "assign_codes: x {} and codebook {} need shapes [N, D] and [K, D]", x.desc(), embed.desc());
  VQDDP_CHECK(x.device() == embed.device(), "assign_codes: x is on {}, the codebook on {}", x.device().str(),
              embed.device().str());
  VQDDP_CHECK(embed.size(0) > 0 && x.size(1) > 0, "assign_codes: empty codebook {}", embed.desc());
  Tensor indices = empty({x.size(0)}, DType::i64, x.device());
  vq_kernels(x.device()).assign(x, embed, cosine, indices);
  return indices;
}

Tensor l2_normalize_rows(const Tensor& x) {
  VQDDP_CHECK(x.dim() == 2, "l2_normalize_rows expects [N, D], got {}", x.desc());
  // Clamp the squared norm (at 1e-24 = (1e-12)^2) before the sqrt so an
  // all-zero row gets a finite gradient instead of 0 * inf.
  Tensor norm = sqrt(clamp(sum(square(x), 1, true), 1e-24f, 3.4e38f));  // (N, 1)
  return div(x, norm);
}

}  // namespace vqddp
