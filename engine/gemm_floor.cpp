#include "engine/gemm_floor.h"

#include <algorithm>
#include <chrono>

namespace vqddp {

double measure_gemm_floor(Device device) {
  constexpr int64_t m = 16384, n = 1024, k = 256;
  DeviceKernels& dk = device_kernels(device);
  float* a = static_cast<float*>(dk.alloc(m * k * sizeof(float)));
  float* b = static_cast<float*>(dk.alloc(n * k * sizeof(float)));
  float* c = static_cast<float*>(dk.alloc(m * n * sizeof(float)));
  // Values that stay normal numbers: the time does not depend on them.
  dk.fill(a, DType::f32, m * k, 0.5);
  dk.fill(b, DType::f32, n * k, 0.25);
  auto best_seconds = [&](auto&& product) {
    double best = 1e30;
    for (int rep = 0; rep < 4; ++rep) {  // the first is the warm-up
      dk.synchronize();
      const auto start = std::chrono::steady_clock::now();
      product();
      dk.synchronize();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (rep > 0) best = std::min(best, s);
    }
    return best;
  };
  // A linear layer's forward, x (m, k) @ W^T with W stored (n, k), both ways.
  const double sgemm = best_seconds([&] { dk.gemm(false, true, m, n, k, 1.f, a, k, b, k, 0.f, c, n); });
  const double fixed = best_seconds([&] { dk.gemm_fixed(false, true, m, n, k, a, k, b, k, c, n, GemmBatch{}); });
  dk.release(a, m * k * sizeof(float));
  dk.release(b, n * k * sizeof(float));
  dk.release(c, m * n * sizeof(float));
  return 2.0 * m * n * k / std::min(sgemm, fixed) / 1e9;
}

}  // namespace vqddp
