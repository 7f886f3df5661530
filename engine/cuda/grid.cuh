// Launch geometry shared by the engine's kernels: grid-stride loops over
// int64 element counts with a capped grid, so any size launches.
#pragma once

#include <cstdint>

namespace vqddp::cuda {

constexpr int kThreads = 256;

inline unsigned grid_for(int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
}

// for (int64_t i : grid_stride(n)) style loop as a macro: the index type is
// int64 so tensors above 2^31 elements work.
#define VQDDP_GRID_LOOP(i, n)                                                                   \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);         \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

}  // namespace vqddp::cuda
