// Helpers of the GPU tests: the CPU is the reference, the same inputs run
// on cuda:0 and the results come back to the host for comparison.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "engine/nn.h"
#include "engine/ops.h"
#include "engine/core/random.h"

namespace vqddp::test {

inline const Device kGpu = Device::cuda(0);
inline const Device kCpu = Device::cpu();

// Standard-normal host data, one stream per use.
inline Tensor randn(const Shape& s, uint64_t stream, float mean = 0.f) {
  Generator g(77, stream);
  return rand_normal(s, g, mean);
}

// |gpu - cpu| <= atol + rtol |cpu| element-wise (NaN must match NaN).
inline void check_matches(const Tensor& gpu, const Tensor& cpu, double rtol, double atol = 1e-6) {
  REQUIRE(gpu.device() == kGpu);
  REQUIRE(gpu.shape() == cpu.shape());
  REQUIRE(gpu.dtype() == cpu.dtype());
  if (cpu.dtype() == DType::i64) {
    CHECK(gpu.to_vector<int64_t>() == cpu.to_vector<int64_t>());
    return;
  }
  std::vector<float> g = gpu.to_vector<float>(), c = cpu.to_vector<float>();
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < c.size(); ++i) {
    bool both_nan = std::isnan(g[i]) && std::isnan(c[i]);
    if (!both_nan && !(std::abs(double(g[i]) - c[i]) <= atol + rtol * std::abs(double(c[i])))) {
      if (bad++ == 0) first = static_cast<int64_t>(i);
    }
  }
  CAPTURE(first);
  CAPTURE(first >= 0 ? g[first] : 0.f);
  CAPTURE(first >= 0 ? c[first] : 0.f);
  CHECK(bad == 0);
}

// A module's state on the host, by name (for bitwise comparisons).
inline NamedTensors host_state(const Module& m) { return m.state_copy(kCpu); }

}  // namespace vqddp::test
