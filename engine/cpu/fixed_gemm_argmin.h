// The nearest-row search fused into the fixed-order product on the CPU: a
// row's best score over a table's rows without storing the scores (the VQ
// assignment, vq/assign.h, is its caller).
// Internal header: not installed with the library (the CPU kernels' fused product and argmin).
#pragma once

#include <cstdint>

namespace vqddp {

// For each row x_i of x (n, d): out[i] = argmin_j bias[j] - factor * dot(x_i, e_j)
// over the rows e_j of the table embed (k, d), with dot the fixed_gemm chain, the
// score rounded as written (a product, then a difference), ties to the
// lowest j, scores that are NaN or +inf never chosen (no number: 0). The
// n x k scores are never stored. k < 2^31.
void fixed_gemm_argmin(int64_t n, int64_t d, int64_t k, const float* x, const float* embed, const float* bias,
                       float factor, int64_t* out);

}  // namespace vqddp
