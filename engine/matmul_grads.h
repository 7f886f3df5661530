// The backward of matmul, for ops that are a matmul in disguise (a
// convolution computed without its im2col buffer, engine/ops_conv.cpp):
// they hand it the operands the matmul would have had, so their gradients
// are matmul's, bit for bit, in an exact step and out of one.
// Internal header: not installed with the library (shared by the ops that are a matmul in disguise).
#pragma once

#include <vector>

#include "engine/core/tensor.h"

namespace vqddp {

// {dA, dB} of C = op(A) op(B) for the upstream gradient g [m, n] (either
// undefined where need_a / need_b is false). a, b and g are products'
// inputs already in the run's precision (engine/precision.h: the callers
// round what they saved and the gradient they got), so the products here
// round nothing again. partials_a / partials_b: give
// that operand's gradient as unit partials [units, ...shape] (what
// wants_unit_partials says for it in the op that calls this).
std::vector<Tensor> matmul_grads(const Tensor& a, const Tensor& b, const Tensor& g, bool ta, bool tb, bool need_a,
                                 bool need_b, bool partials_a, bool partials_b);

}  // namespace vqddp
