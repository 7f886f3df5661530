// Element types and shapes a Tensor can have (its device: engine/device.h).
//
// Three element types. float32 is the type of parameters, activations,
// codebooks and every differentiable op. float64 holds sums that must not
// depend on their order: the per-code statistics reduced across ranks
// (vq/code_stats.h), the gradient norm's sum, non-finite flags. int64
// carries indices and counts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace vqddp {

// f64 exists for statistics that must not depend on summation order (code
// counts and sums reduced across ranks); the differentiable ops are f32.
enum class DType : uint8_t { f32, i64, f64 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "float32", "int64", "float64"

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::f32; }
template <>
constexpr DType dtype_of<int64_t>() { return DType::i64; }
template <>
constexpr DType dtype_of<double>() { return DType::f64; }

// Shapes are int64 like indices, so element counts never overflow int.
using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "[2, 3]"

}  // namespace vqddp
