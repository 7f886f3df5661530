// Element types and devices a Tensor can have.
//
// Three element types. float32 is the type of parameters, activations,
// codebooks and every differentiable op. float64 holds sums that must not
// depend on their order: the per-code statistics reduced across ranks
// (vq/code_stats.h), the gradient norm's sum, non-finite flags. int64
// carries indices and counts.
// Devices: cpu, cuda:N and the simulated sim:N (below).
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

// Where a tensor's memory lives. `sim` is the simulated device: memory the
// host may not touch (Tensor::data throws, as for a GPU), arithmetic by the
// CPU's kernels (so the CPU's bits), and every transfer and wait counted
// (engine/device_counters.h). It runs every device path of vq/ and train/
// on machines without a GPU, and tests that a step never waits on the host.
struct Device {
  enum class Kind : uint8_t { cpu, cuda, sim };
  Kind kind = Kind::cpu;
  int index = 0;  // GPU ordinal for cuda, simulated device number for sim; 0 for cpu

  static Device cpu() { return {}; }
  static Device cuda(int index) { return {Kind::cuda, index}; }
  static Device sim(int index = 0) { return {Kind::sim, index}; }
  bool is_cpu() const { return kind == Kind::cpu; }
  bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu", "cuda:0", "sim:0"
};

// "cpu", "cuda", "cuda:N", "sim", "sim:N" -> Device; throws naming `what`
// (a flag or config key) and the text otherwise.
Device parse_device(const std::string& text, const std::string& what);

// Shapes are int64 like indices, so element counts never overflow int.
using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "[2, 3]"

}  // namespace vqddp
