// The VQ hot path for tensors on a GPU (kernels in vq/cuda/): assign_codes
// and the codebook's EMA step call these for cuda tensors. They compute
// what the CPU code next to them computes (assign.cpp, codebook.cpp); the
// CPU stays the reference the GPU tests compare against. In a build without
// CUDA they throw (no cuda tensor can exist there).
#pragma once

#include "engine/tensor.h"

namespace vqddp {

// x (N, D), embed (K, D) on one GPU -> indices (N) int64 on it, the CPU's
// codes bit for bit. A fused kernel computes each 128-row x 128-code tile
// of dot products with the fixed-order GEMM's tile (fixed_gemm.h's chains),
// scores them and keeps each row's best per tile; a merge kernel then takes
// each row's best over its tiles. Rows go in blocks of at most 2^24
// partial results, so the N x K scores are never stored.
Tensor assign_codes_device(const Tensor& x, const Tensor& embed, bool cosine);

// Steps 6 and 7 of the EMA codebook from the all-reduced float64 stats
// [K + K*D], in place on the three float32 tensors.
void ema_update_device(const Tensor& stats, Tensor& cluster_size, Tensor& embed_avg, Tensor& embed, float decay,
                       float eps);

}  // namespace vqddp
