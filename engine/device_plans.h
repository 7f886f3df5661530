// Internal to the engine's ops: picking the device of an op's operands and
// describing shapes to the device kernels (engine/device.h).
// Internal header: not installed with the library (the kernels' index plans, built by the ops).
#pragma once

#include <initializer_list>

#include "engine/device.h"
#include "engine/core/tensor.h"

namespace vqddp {

// The kernels of the operands' device (the CPU's when none is defined):
// every op runs through these, on every device. Throws naming the op and
// both devices when the operands' devices differ.
DeviceKernels& device_of(const char* op, std::initializer_list<const Tensor*> operands);

// Checks that the device indices lie in [0, rows) with one min/max read-
// back, so a bad index is an error naming `op`, the first bad position and
// `what` ("rows", "codes"), not a wild read by a kernel. Only a failing
// check reads the indices themselves back.
void check_device_indices(DeviceKernels& k, const char* op, const Tensor& index, int64_t rows, const char* what);

// Output `out` of a broadcasting binary op on operands of shapes a and b.
BroadcastPlan broadcast_plan(const Shape& a, const Shape& b, const Shape& out);
// Sum of a tensor of shape `in` down to `out` (out broadcasts to in).
ReducePlan sum_to_plan(const Shape& in, const Shape& out, double divisor);
// Sum over the middle of [outer, n, inner].
ReducePlan sum_dim_plan(int64_t outer, int64_t n, int64_t inner, double divisor);

}  // namespace vqddp
