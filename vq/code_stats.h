// Per-code statistics of one batch: how many rows chose each code and the
// sum of those rows.
//
// They are returned in ONE float32 buffer [K + K*D] (counts first, then the
// sums row by row) so the codebook reduces them across ranks with a single
// all_reduce. Rows are added in ascending row order, so the local result is
// deterministic; counts are exact as floats up to 2^24 rows per code and step.
#pragma once

#include "engine/tensor.h"

namespace vqddp {

// x (N, D), indices (N) int64 in [0, K) -> (K + K*D).
Tensor code_stats(const Tensor& x, const Tensor& indices, int64_t codebook_size);

// Views into a stats buffer: counts (K) and sums (K, D).
Tensor stats_counts(const Tensor& stats, int64_t codebook_size);
Tensor stats_sums(const Tensor& stats, int64_t codebook_size, int64_t dim);

}  // namespace vqddp
