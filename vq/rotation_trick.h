// How the gradient passes the quantizer: the straight-through estimator, or
// the rotation trick (Fifty et al. 2024, arXiv 2410.06424, section 4.2;
// vector-quantize-pytorch's `rotation_trick`, on by default there).
//
// Rotation trick, per row e (the quantizer input) and q (its code):
//   u = e / max(|e|, 1e-6),  q^ = q / max(|q|, 1e-6),
//   w = (u + q^) / max(|u + q^|, 1e-6)
//   out = (e - 2 (e.w) w + 2 (e.u) q^) * (|q| / max(|e|, 1e-6))
// with u, q^, w and the scale detached: out has q's value (up to rounding:
// the rotation R with R u = q^, scaled) and the gradient R^T g |q|/|e|,
// which keeps the angle between the gradient and the input instead of
// copying the gradient unchanged. Rows are independent: no collective, the
// same bits for a row on any split of the batch.
#pragma once

#include "engine/core/tensor.h"

namespace vqddp {

// The rotated code, as above: (M, d), (M, d) -> (M, d).
Tensor rotate_to(const Tensor& e, const Tensor& q);

// The quantizer's output for input z and codes q in a training step:
// rotate_to(z, q) with the rotation trick when z requires grad (there is no
// gradient to shape otherwise), else straight_through(z, q).
Tensor through_quantizer(const Tensor& z, const Tensor& q, bool rotation_trick);

}  // namespace vqddp
