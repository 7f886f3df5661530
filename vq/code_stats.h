// Per-code statistics of one batch: how many rows chose each code and the
// sum of those rows.
//
// They are returned in ONE float64 buffer [K + K*D] (counts first, then the
// sums row by row) so the codebook reduces them across ranks with a single
// all_reduce. Float64 makes the sums all but independent of their order:
// the float32 rows are exact in double, so partial sums per rank added in
// rank order equal one rank's sum of every row unless the values span more
// than ~2^29 in magnitude, and the codebook (float32) sees the same numbers
// whichever way the batch was split. Counts are exact.
#pragma once

#include "engine/tensor.h"

namespace vqddp {

// x (N, D), indices (N) int64 in [0, K) -> (K + K*D).
Tensor code_stats(const Tensor& x, const Tensor& indices, int64_t codebook_size);

// Views into a stats buffer: counts (K) and sums (K, D).
Tensor stats_counts(const Tensor& stats, int64_t codebook_size);
Tensor stats_sums(const Tensor& stats, int64_t codebook_size, int64_t dim);

}  // namespace vqddp
