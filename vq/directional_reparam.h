// Directional reparameterisation (DiVeQ, vector-quantize-pytorch's
// directional_reparam; figure 1 of "DiVeQ", ICLR 2026 submission): in a
// training step the output is
//   y = x + u |q - x|,   u = unit(q - x + sqrt(variance) n), detached,
// so y's value is near the code q, its gradient reaches the input through
// x and the (learnable) code through |q - x|, and the noise n ~ N(0, 1)
// keeps the direction from being exact.
//
// DDP: n of global row g, element j is the standard normal drawn from
// words 2 (g D + j) and 2 (g D + j) + 1 of one shared stream per step, so a
// row's output is the same on any split over any number of ranks; the
// noise is drawn on the host (an upload on a device, no read-back).
#pragma once

#include "engine/core/random.h"
#include "engine/core/tensor.h"

namespace vqddp {

// The reference's default noise variance (ResidualVQ's diveq uses it).
inline constexpr float kDirectionalReparamVariance = 5e-3f;

// src, tgt (N, D) on one device; the first of this rank's rows is global
// row `first_row`.
Tensor directional_reparam(const Tensor& src, const Tensor& tgt, float variance, int64_t first_row,
                           const Generator& step_stream);

}  // namespace vqddp
