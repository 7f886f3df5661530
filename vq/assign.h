// Nearest-code assignment: the VQ hot path.
//
// For Euclidean codebooks, index_n = argmin_k |x_n|^2 - 2 x_n.e_k + |e_k|^2;
// the |x_n|^2 term is the same for every k, so it is left out of the
// comparison. For cosine codebooks (rows already l2-normalised) index_n =
// argmax_k x_n.e_k. Ties go to the LOWEST k in both cases.
//
// Batch-invariant (engine/cpu/fixed_gemm.h): x_n.e_k is the fixed fma chain over D, the
// score bias_k - factor * dot is rounded as written, and the argmin is a
// total order (score, then k), so a row's code never depends on the batch,
// the split over ranks, the threads or the CPU; k-means and every quantizer
// that assigns codes go through here. The distance and the argmin are fused
// on both devices, so the N x K scores are never stored: on the CPU
// (fixed_gemm_argmin) per panel of codes; on a GPU per 128-row x 128-code
// tile of the same fixed-order GEMM, each row's per-tile bests then merged
// in code order (vq/kernels/cuda/vq_kernels.cu).
#pragma once

#include "engine/core/tensor.h"

namespace vqddp {

// x (N, D), embed (K, D) -> indices (N) int64. No autograd.
Tensor assign_codes(const Tensor& x, const Tensor& embed, bool cosine);


}  // namespace vqddp
