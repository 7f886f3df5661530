// The arithmetic of exact data parallelism's one cross-unit sum
// (Communicator::reduce_units), in one place for every host loop that runs
// it: the thread and MPI backends' transports and the CPU's unit_sums
// kernel (a world of one). The CUDA kernel (kernels_elementwise.cu
// unit_sums_kernel) runs the same per-column loop.
// Internal header: not installed with the library (the host loops of the exact unit sum).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace vqddp {

// The sum of exact data parallelism (Communicator::reduce_units): columns
// [begin, end) of the units' rows, rank r's `counts[r]` rows of `n` floats at
// in[r], added in global unit order (rank 0's rows first) in double from 0
// and rounded to float once, into every buffer of `out` ([n] each). Every
// transport adds units with this loop or the unit_sums kernel, never with
// the engine's sum along dimension 0: the CPU's is ascending too, but a
// GPU's is a tree beyond 64 rows (kernels_reduce.cu).
inline void ordered_unit_sum(const std::vector<const float*>& in, const std::vector<int64_t>& counts, int64_t n,
                             const std::vector<float*>& out, int64_t begin, int64_t end) {
  constexpr int64_t kBlock = 2048;
  double acc[kBlock];
  float rounded[kBlock];
  for (int64_t b = begin; b < end; b += kBlock) {
    int64_t len = std::min(kBlock, end - b);
    std::fill_n(acc, len, 0.0);
    for (size_t r = 0; r < in.size(); ++r)
      for (int64_t u = 0; u < counts[r]; ++u) {
        const float* row = in[r] + u * n + b;
        for (int64_t i = 0; i < len; ++i) acc[i] += row[i];
      }
    for (int64_t i = 0; i < len; ++i) rounded[i] = static_cast<float>(acc[i]);
    for (float* o : out) std::memcpy(o + b, rounded, len * sizeof(float));
  }
}

}  // namespace vqddp
