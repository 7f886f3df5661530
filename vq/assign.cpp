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


}  // namespace vqddp
