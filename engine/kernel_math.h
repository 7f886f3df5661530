// Elementwise math shared by the CPU loops and the CUDA kernels.
//
// One definition per formula: the CPU ops and the GPU kernels call the same
// functions, so the two backends cannot drift apart (the CPU stays the
// reference the GPU is tested against). The header is plain C++ for g++ and
// __host__ __device__ under nvcc; it uses the C math functions (expf, erf,
// ...) that exist on both sides.
#pragma once

#include <math.h>

#ifdef __CUDACC__
#define VQDDP_HD __host__ __device__ __forceinline__
#else
#define VQDDP_HD inline
#endif

namespace vqddp {

enum class BinaryOp : unsigned char { add, sub, mul, div };

VQDDP_HD float apply_binary(BinaryOp op, float a, float b) {
  switch (op) {
    case BinaryOp::add: return a + b;
    case BinaryOp::sub: return a - b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
  }
  return 0.f;
}

// A unary op and its derivative. `low`/`high` are clamp's bounds.
struct UnaryFn {
  enum class Op : unsigned char { neg, square, sqrt, exp, log, relu, gelu, tanh, sigmoid, clamp };
  Op op;
  float low = 0.f, high = 0.f;

  // y = f(x)
  VQDDP_HD float f(float v) const {
    constexpr double kInvSqrt2 = 0.70710678118654752440;
    switch (op) {
      case Op::neg: return -v;
      case Op::square: return v * v;
      case Op::sqrt: return ::sqrtf(v);
      case Op::exp: return ::expf(v);
      case Op::log: return ::logf(v);
      case Op::relu: return v > 0.f ? v : 0.f;
      case Op::gelu: return static_cast<float>(0.5 * v * (1.0 + ::erf(v * kInvSqrt2)));
      case Op::tanh: return ::tanhf(v);
      case Op::sigmoid: return 1.f / (1.f + ::expf(-v));
      case Op::clamp: {  // std::min(std::max(v, low), high): NaN stays NaN
        float t = v < low ? low : v;
        return high < t ? high : t;
      }
    }
    return 0.f;
  }

  // dy/dx from the input v and the output y (each formula reads whichever
  // is cheaper and more accurate).
  VQDDP_HD float df(float v, float y) const {
    constexpr double kInvSqrt2 = 0.70710678118654752440;
    constexpr double kInvSqrt2Pi = 0.39894228040143267794;
    switch (op) {
      case Op::neg: return -1.f;
      case Op::square: return 2.f * v;
      case Op::sqrt: return 0.5f / y;
      case Op::exp: return y;
      case Op::log: return 1.f / v;
      case Op::relu: return v > 0.f ? 1.f : 0.f;
      case Op::gelu: {
        double cdf = 0.5 * (1.0 + ::erf(v * kInvSqrt2));
        double pdf = kInvSqrt2Pi * ::exp(-0.5 * double(v) * v);
        return static_cast<float>(cdf + v * pdf);
      }
      case Op::tanh: return 1.f - y * y;
      case Op::sigmoid: return y * (1.f - y);
      case Op::clamp: return v >= low && v <= high ? 1.f : 0.f;
    }
    return 0.f;
  }
};

// Arg-min/arg-max candidate order: is (v, i) better than the current best
// (bv, bi)? A number beats NaN; among numbers the smaller (larger for max)
// wins and equal values go to the lower index. The rule is a total order on
// (value, index) pairs, so any reduction tree picks the same winner as the
// CPU's left-to-right scan.
VQDDP_HD bool arg_better(float v, long long i, float bv, long long bi, bool max) {
  bool vn = v != v, bn = bv != bv;  // isnan without <cmath> in device code
  if (vn != bn) return bn;          // a number beats NaN
  if (vn) return i < bi;            // both NaN: lowest index (all-NaN rows give 0)
  if (v != bv) return max ? v > bv : v < bv;
  return i < bi;
}

}  // namespace vqddp
