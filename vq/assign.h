// Nearest-code assignment: the VQ hot path.
//
// For Euclidean codebooks, index_n = argmin_k |x_n|^2 - 2 x_n.e_k + |e_k|^2;
// the |x_n|^2 term is the same for every k, so it is left out of the
// comparison. For cosine codebooks (rows already l2-normalised) index_n =
// argmax_k x_n.e_k. Ties go to the LOWEST k in both cases.
//
// The N x K score matrix is never materialised: rows are processed in
// blocks of kAssignBlockRows, each one sgemm into a block-sized buffer
// followed by a row-wise argmin, so peak extra memory is
// kAssignBlockRows * K floats whatever N is.
#pragma once

#include "engine/tensor.h"

namespace vqddp {

constexpr int64_t kAssignBlockRows = 512;

// x (N, D), embed (K, D) -> indices (N) int64. No autograd.
Tensor assign_codes(const Tensor& x, const Tensor& embed, bool cosine);

// Rows scaled to unit L2 norm (norm clamped below at 1e-12, as
// torch.nn.functional.normalize does). Differentiable.
Tensor l2_normalize_rows(const Tensor& x);

}  // namespace vqddp
