// stochastic_sample_codes: in a training step each row's code is drawn from
// softmax(logits / temperature) by the Gumbel-max trick, as
// vector-quantize-pytorch's gumbel_sample(stochastic=True):
//   code = argmax_k logits_k / temperature - log(-log(u_k)),
// the logits minus the Euclidean distance (the reference's cdist:
// sqrt(max(|x|^2 + |e|^2 - 2 x.e, 1e-8))) or, for cosine codebooks, the
// dot product of unit rows; both logs clamp at 1e-20, as there.
//
// DDP: the uniform u of GLOBAL row g and code k is word g * K + k of one
// shared stream per step, so a row draws the same code on any split over
// any number of ranks; its logits depend on the row alone (the fixed-order
// chains of engine/cpu/fixed_gemm.h). Ties go to the lowest k. Runs on the
// host, on every device (a copy there and back: the option's cost is one
// N x K pass, measured in bench/quantizer_step.cpp).
#pragma once

#include "engine/core/random.h"
#include "engine/core/tensor.h"

namespace vqddp {

// x (N, D) rows of this rank, the first of them global row `first_row`;
// codes (K, D). temperature > 0. Returns indices (N) int64 on x's device.
Tensor gumbel_sample_codes(const Tensor& x, const Tensor& codes, bool cosine, float temperature, int64_t first_row,
                           const Generator& step_stream);

}  // namespace vqddp
