#include "vq/code_stats.h"

#include "engine/device.h"
#include "engine/device_plans.h"

namespace vqddp {

Tensor code_stats(const Tensor& x, const Tensor& indices, int64_t k) {
  VQDDP_CHECK(x.dim() == 2 && indices.dim() == 1 && indices.size(0) == x.size(0),
              "code_stats: x {} and indices {} do not match", x.desc(), indices.desc());
  int64_t n = x.size(0), d = x.size(1);
  if (!x.device().is_cpu()) {
    VQDDP_CHECK(indices.device() == x.device(), "code_stats: x on {}, indices on {}", x.device().str(),
                indices.device().str());
    DeviceKernels& kernels = device_kernels(x.device());
    check_device_indices(kernels, "code_stats", indices, k, "codes");
    // Counts then sums, sorted by code and summed in a fixed order: the
    // same numbers on every run, no floating-point atomics.
    Tensor stats = empty({k + k * d}, DType::f64, x.device());
    auto* p = static_cast<double*>(stats.raw_ptr());
    kernels.index_add_rows(static_cast<const float*>(x.raw_ptr()), static_cast<const int64_t*>(indices.raw_ptr()),
                           n, d, k, p, p + k);
    return stats;
  }
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
