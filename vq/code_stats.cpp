#include "vq/code_stats.h"

namespace vqddp {

Tensor code_stats(const Tensor& x, const Tensor& indices, int64_t k) {
  VQDDP_CHECK(x.dim() == 2 && indices.dim() == 1 && indices.size(0) == x.size(0),
              "code_stats: x {} and indices {} do not match", x.desc(), indices.desc());
  int64_t n = x.size(0), d = x.size(1);
  Tensor stats = zeros({k + k * d}, DType::f64);
  double* counts = stats.data<double>();
  double* sums = counts + k;
  const float* px = x.data<float>();
  const int64_t* pi = indices.data<int64_t>();
  for (int64_t r = 0; r < n; ++r) {
    int64_t c = pi[r];
    VQDDP_CHECK(c >= 0 && c < k, "code_stats: index {} of row {} outside codebook of {}", c, r, k);
    counts[c] += 1.0;
    double* dst = sums + c * d;
    const float* src = px + r * d;
    for (int64_t j = 0; j < d; ++j) dst[j] += src[j];
  }
  return stats;
}

Tensor stats_counts(const Tensor& stats, int64_t k) { return stats.reshape({-1}).slice_rows(0, k); }

Tensor stats_sums(const Tensor& stats, int64_t k, int64_t d) {
  return stats.reshape({-1}).slice_rows(k, k + k * d).reshape({k, d});
}

}  // namespace vqddp
