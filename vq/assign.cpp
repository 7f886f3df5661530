#include "vq/assign.h"

#include <vector>

#include "engine/fixed_gemm.h"
#include "engine/ops.h"
#include "vq/device_vq.h"

namespace vqddp {

Tensor assign_codes(const Tensor& x, const Tensor& embed, bool cosine) {
  VQDDP_CHECK(x.dim() == 2 && embed.dim() == 2 && x.size(1) == embed.size(1),
              "assign_codes: x {} and codebook {} need shapes [N, D] and [K, D]", x.desc(), embed.desc());
  int64_t n = x.size(0), k = embed.size(0), d = x.size(1);
  VQDDP_CHECK(k > 0 && d > 0, "assign_codes: empty codebook {}", embed.desc());
  if (!x.device().is_cpu() || !embed.device().is_cpu()) return assign_codes_device(x, embed, cosine);
  Tensor indices = empty({n}, DType::i64);
  const float* px = x.data<float>();
  const float* pe = embed.data<float>();
  int64_t* pi = indices.data<int64_t>();

  // Per-code bias: |e_k|^2 for Euclidean (score = bias - 2 x.e, minimised);
  // cosine maximises x.e, i.e. minimises 0 - x.e, the same loop with bias 0
  // and factor 1.
  std::vector<float> bias(k, 0.f);
  if (!cosine)
    for (int64_t j = 0; j < k; ++j) {
      double s = 0;
      for (int64_t c = 0; c < d; ++c) s += double(pe[j * d + c]) * pe[j * d + c];
      bias[j] = static_cast<float>(s);
    }
  fixed_gemm_argmin(n, d, k, px, pe, bias.data(), cosine ? 1.f : 2.f, pi);
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
