#include "vq/assign.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/blas.h"
#include "engine/ops.h"
#include "vq/device_vq.h"

namespace vqddp {

namespace {

// argmin_j bias[j] - factor * dot[j], ties to the lowest j. kLanes
// independent running minima (lane l sees j = l mod kLanes, strict <, so
// each keeps its first minimum) let the compiler vectorise the scan; the
// lanes are then merged by value and, on equal values, by lower index.
int64_t argmin_score(const float* bias, const float* dot, float factor, int64_t k) {
  constexpr int kLanes = 16;
  float best[kLanes];
  int64_t at[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    best[l] = INFINITY;
    at[l] = -1;
  }
  int64_t j = 0;
  for (; j + kLanes <= k; j += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      float s = bias[j + l] - factor * dot[j + l];
      bool better = s < best[l];
      best[l] = better ? s : best[l];
      at[l] = better ? j + l : at[l];
    }
  int64_t result = -1;
  float result_score = INFINITY;
  for (int l = 0; l < kLanes; ++l)
    if (at[l] >= 0 && (best[l] < result_score || (best[l] == result_score && at[l] < result))) {
      result_score = best[l];
      result = at[l];
    }
  for (; j < k; ++j) {
    float s = bias[j] - factor * dot[j];
    if (s < result_score) {  // the tail has higher indices: strict keeps the lower
      result_score = s;
      result = j;
    }
  }
  // Only NaN scores (a NaN codebook): fall back to code 0, as argmin does.
  return result < 0 ? 0 : result;
}

}  // namespace

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
  float factor = cosine ? 1.f : 2.f;
  std::vector<float> dots(kAssignBlockRows * k);  // (block rows, K)
  for (int64_t r0 = 0; r0 < n; r0 += kAssignBlockRows) {
    int64_t rows = std::min(kAssignBlockRows, n - r0);
    blas_sgemm(false, true, rows, k, d, 1.f, px + r0 * d, d, pe, d, 0.f, dots.data(), k);
    for (int64_t r = 0; r < rows; ++r) pi[r0 + r] = argmin_score(bias.data(), dots.data() + r * k, factor, k);
  }
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
