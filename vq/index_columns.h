// Index matrices (N, Q) of multi-layer and multi-head quantizers as Q
// columns (N), and codes for a column where -1 (a dropped layer, a masked
// row) means "no code": the pieces every decode and forward shares.
// Internal header: not installed with the library (the quantizers' index column helpers).
#pragma once

#include <functional>
#include <vector>

#include "engine/core/tensor.h"

namespace vqddp {

// Q columns (N) int64 -> (N, Q), on the columns' device.
Tensor stack_columns(const std::vector<Tensor>& columns);
// (N, Q) -> Q columns (N).
std::vector<Tensor> split_columns(const Tensor& indices);

// (N, width): `lookup` of the valid entries (>= 0) of `indices` (N), and
// zero rows where an entry is -1. `lookup` maps M indices to (M, width).
Tensor codes_or_zero(const Tensor& indices, int64_t width, const std::function<Tensor(const Tensor&)>& lookup);

}  // namespace vqddp
