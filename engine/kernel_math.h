// Elementwise math shared by the CPU loops and the CUDA kernels.
//
// One definition per formula: the CPU ops and the GPU kernels call the same
// functions, so the two backends cannot drift apart (the CPU stays the
// reference the GPU is tested against). The header is plain C++ for g++ and
// __host__ __device__ under nvcc. The exponential family (exp, expm1, log,
// tanh, sigmoid) is its own, in rounded float operations, so host and
// device agree to the bit; gelu, erf, atan and tan (and gelu's and erf's
// derivatives) use the C math functions in double, which exist on both
// sides and almost never round apart.
#pragma once

#include <math.h>
#include <tuple>

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

// ---- float arithmetic rounded exactly as written ---------------------------
//
// nvcc contracts a * b + c into one FMA (one rounding instead of two) by
// default, and so does g++ wherever the target has FMA (aarch64,
// -march=native); the project builds with -ffp-contract=off (meson.build)
// so the host never does. The CUDA _rn intrinsics are never contracted, so
// a formula written with these helpers rounds after every operation, in the
// order written, on both sides: the GPU gets the CPU's bits.
#ifdef __CUDA_ARCH__
VQDDP_HD float mul_rn(float a, float b) { return __fmul_rn(a, b); }
VQDDP_HD float add_rn(float a, float b) { return __fadd_rn(a, b); }
VQDDP_HD float sub_rn(float a, float b) { return __fsub_rn(a, b); }
VQDDP_HD float div_rn(float a, float b) { return __fdiv_rn(a, b); }
VQDDP_HD float sqrt_rn(float a) { return __fsqrt_rn(a); }
VQDDP_HD double mul_rn(double a, double b) { return __dmul_rn(a, b); }
VQDDP_HD double add_rn(double a, double b) { return __dadd_rn(a, b); }
VQDDP_HD double div_rn(double a, double b) { return __ddiv_rn(a, b); }
VQDDP_HD float fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
#else
VQDDP_HD float mul_rn(float a, float b) { return a * b; }
VQDDP_HD float add_rn(float a, float b) { return a + b; }
VQDDP_HD float sub_rn(float a, float b) { return a - b; }
VQDDP_HD float div_rn(float a, float b) { return a / b; }
VQDDP_HD float sqrt_rn(float a) { return ::sqrtf(a); }
VQDDP_HD double mul_rn(double a, double b) { return a * b; }
VQDDP_HD double add_rn(double a, double b) { return a + b; }
VQDDP_HD double div_rn(double a, double b) { return a / b; }
VQDDP_HD float fma_rn(float a, float b, float c) { return ::fmaf(a, b, c); }  // one rounding, like the SIMD fma
#endif

// Weight normalization (engine/nn_conv.h weight_norm), R rows of v at a
// time (row r at v + r cols): w = v * s with s = g / |v|, where |v| is
// sqrt_rn of the row's float squares summed in double in ascending order
// and rounded to float (the bits the composite square, sum, sqrt, div and
// mul gave on the CPU). Each row's sum is one chain of dependent double
// adds; R rows side by side (the CPU takes eight) let the adds of
// different rows overlap instead of each waiting out the last one's
// latency, and leave every row's bits as R = 1 gives them.
template <int R>
VQDDP_HD void weight_norm_rows_norm(const float* v, int64_t cols, float* norms) {
  double ss[R];
  for (int r = 0; r < R; ++r) ss[r] = 0.0;
  for (int64_t j = 0; j < cols; ++j)
    for (int r = 0; r < R; ++r) {
      const float x = v[r * cols + j];
      ss[r] = add_rn(ss[r], static_cast<double>(mul_rn(x, x)));
    }
  for (int r = 0; r < R; ++r) norms[r] = sqrt_rn(static_cast<float>(ss[r]));
}
template <int R>
VQDDP_HD void weight_norm_rows(const float* v, const float* g, int64_t cols, float* w) {
  float n[R];
  weight_norm_rows_norm<R>(v, cols, n);
  for (int r = 0; r < R; ++r) {
    const float s = div_rn(g[r], n[r]);
    for (int64_t j = 0; j < cols; ++j) w[r * cols + j] = mul_rn(v[r * cols + j], s);
  }
}
// Its backward for the rows' upstream gradient dw, with n = |v|, s = g / n
// and dot = sum of dw[j] v[j] in double (ascending), per row:
//   dg = dot / n,   dv[j] = s dw[j] - c v[j],   c = g dot / n^3,
// dg and c in double, each rounded once.
template <int R>
VQDDP_HD void weight_norm_rows_backward(const float* v, const float* g, const float* dw, int64_t cols, float* dv,
                                        float* dg) {
  float n[R];
  weight_norm_rows_norm<R>(v, cols, n);
  double dot[R];
  for (int r = 0; r < R; ++r) dot[r] = 0.0;
  for (int64_t j = 0; j < cols; ++j)
    for (int r = 0; r < R; ++r)
      dot[r] = add_rn(dot[r], mul_rn(static_cast<double>(dw[r * cols + j]), static_cast<double>(v[r * cols + j])));
  for (int r = 0; r < R; ++r) {
    const float s = div_rn(g[r], n[r]);
    const double nd = n[r];
    dg[r] = static_cast<float>(div_rn(dot[r], nd));
    const float c = static_cast<float>(div_rn(mul_rn(static_cast<double>(g[r]), dot[r]), mul_rn(mul_rn(nd, nd), nd)));
    for (int64_t j = 0; j < cols; ++j) dv[r * cols + j] = sub_rn(mul_rn(s, dw[r * cols + j]), mul_rn(c, v[r * cols + j]));
  }
}

VQDDP_HD unsigned float_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  return __builtin_bit_cast(unsigned, f);
#endif
}
VQDDP_HD float bits_as_float(unsigned b) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(b);
#else
  return __builtin_bit_cast(float, b);
#endif
}

// c ? a : b from both values by a bit mask, not a branch: g++ does not
// vectorize a loop whose `c ? a : f(v)` only computes f(v) on one side
// (computing it for every lane could raise a floating-point flag the branch
// would not), nor, it turns out, one with `?:` selects among expm1_rn's
// arithmetic; with these the exponential family's loops vectorize (on each
// instruction set's widest vectors: engine/cpu/gemm_kernel.h).
VQDDP_HD float select_bits(bool c, float a, float b) {
  const unsigned mask = 0u - static_cast<unsigned>(c);
  return bits_as_float((float_bits(a) & mask) | (float_bits(b) & ~mask));
}

// ln 2 in two parts: k * kLn2Hi is exact for |k| < 2^8.
inline constexpr float kLn2Hi = 6.93145751953125e-01f;  // ln 2 to 16 bits
inline constexpr float kLn2Lo = 1.42860682030941723e-06f;  // ln 2 - kLn2Hi

// v = k ln2 + r with |r| <= ln2/2, for v already clamped to [-104, 88.8]:
// k by the round-to-nearest shift of 1.5 * 2^23 (whose low bits then hold
// k), into `k` as two's complement. In float, every operation rounded as
// written, as in everything below: the same bits on the host, vectorized
// or not, and in CUDA.
VQDDP_HD float exp_reduce(float c, unsigned& k) {
  constexpr float kShift = 12582912.f;          // 1.5 * 2^23
  constexpr float kLog2e = 1.44269504088896341f;
  const float shifted = add_rn(mul_rn(c, kLog2e), kShift);  // kShift + round(c log2 e)
  const float kf = add_rn(shifted, -kShift);
  k = float_bits(shifted) - float_bits(kShift);
  return add_rn(add_rn(c, -mul_rn(kf, kLn2Hi)), -mul_rn(kf, kLn2Lo));
}

// e^r - 1 for |r| <= ln2/2 by its Taylor series to r^8/8! (truncation
// below 6e-10 relative).
VQDDP_HD float expm1_poly(float r) {
  float p = 1.f / 40320;  // 1/8!
  p = add_rn(1.f / 5040, mul_rn(r, p));
  p = add_rn(1.f / 720, mul_rn(r, p));
  p = add_rn(1.f / 120, mul_rn(r, p));
  p = add_rn(1.f / 24, mul_rn(r, p));
  p = add_rn(1.f / 6, mul_rn(r, p));
  p = add_rn(0.5f, mul_rn(r, p));
  p = add_rn(1.f, mul_rn(r, p));
  return mul_rn(r, p);
}

// The exponential family below is written here rather than taken from
// libm: glibc's expf, logf, tanhf are a call per element (the loops cannot
// vectorize), and their last bits are glibc's, not CUDA's, so a run with a
// sigmoid, tanh or log on the GPU drifted from the same run on the CPU.

// e^v - 1: 2^k (e^r - 1) + (2^k - 1), exact for k = 0 where the result is
// small, or 2^k e^r - 1 where k is large (a sum that cannot cancel, and 2^k
// scaled in two halves so 2^128 e^r < FLT_MAX stays finite). Within 2 ulp
// of e^v - 1 (tests/engine/test_kernel_math.cpp counts them, as for
// each function below). Below -18,
// e^v < 2^-25 and the result is -1; from 88.73 it overflows to +inf; NaN
// stays NaN and -0 stays -0.
VQDDP_HD float expm1_rn(float v) {
  // The clamps as bit selects too: with `?:` g++ would branch.
  float c = select_bits(v < -18.f, -18.f, v);
  c = select_bits(c > 88.8f, 88.8f, c);  // k <= 128
  unsigned k;
  const float p = expm1_poly(exp_reduce(c, k));  // e^r - 1; k in [-26, 128]
  const float half = bits_as_float((k + 126u) << 23);  // 2^(k-1)
  const float two_k = add_rn(half, half);               // 2^k (+inf for k = 128)
  const float small = add_rn(mul_rn(two_k, p), add_rn(two_k, -1.f));
  const float large = add_rn(mul_rn(add_rn(mul_rn(half, p), half), 2.f), -1.f);
  const float y = select_bits(static_cast<int>(k) > 60, large, small);
  return select_bits(v == 0.f, v, y);
}

// e^v: 2^k (1 + (e^r - 1)), with 2^k in two factors that are each a normal
// float (k in [-150, 128]): the first product is exact, the second rounds
// only where the result is subnormal. Within 2 ulp; 0 below -104, +inf from
// 88.73, NaN stays NaN.
VQDDP_HD float exp_rn(float v) {
  float c = select_bits(v < -104.f, -104.f, v);
  c = select_bits(c > 88.8f, 88.8f, c);
  unsigned k;
  const float er = add_rn(1.f, expm1_poly(exp_reduce(c, k)));
  const int k1 = static_cast<int>(k) >> 1, k2 = static_cast<int>(k) - k1;
  return mul_rn(mul_rn(er, bits_as_float(static_cast<unsigned>(k1 + 127) << 23)),
                bits_as_float(static_cast<unsigned>(k2 + 127) << 23));
}

// ln v: v = 2^e m with m in [sqrt(1/2), sqrt(2)) (subnormals first scaled
// by 2^23), f = m - 1 (exact), and ln(1 + f) = 2 atanh(s) with s = f/(2+f),
// |s| <= 0.172, written as f - (f^2/2 - s (f^2/2 + R)) so that the large
// part f is exact and R = 2s^2/3 + 2s^4/5 + ... + 2s^10/11 (truncation
// below 1e-9 relative) only corrects it; then e ln2 split in two as above.
// Within 2 ulp; -inf at 0, NaN below it, +inf at +inf, NaN stays NaN.
VQDDP_HD float log_rn(float v) {
  const bool tiny = v < 1.17549435e-38f;  // subnormal (also 0 and below: replaced at the end)
  const unsigned b = float_bits(select_bits(tiny, mul_rn(v, 8388608.f), v));
  const unsigned mb = (b & 0x7fffffu) | 0x3f800000u;  // m in [1, 2)
  const bool high = mb > 0x3fb504f3u;                  // m > sqrt(2): halve it
  const float m = bits_as_float(mb - (static_cast<unsigned>(high) << 23));
  const int e = static_cast<int>((b >> 23) & 0xffu) - 127 + static_cast<int>(high) - 23 * static_cast<int>(tiny);
  const float f = add_rn(m, -1.f);
  const float s = div_rn(f, add_rn(2.f, f));
  const float z = mul_rn(s, s);
  float r = 2.f / 11;
  r = add_rn(2.f / 9, mul_rn(z, r));
  r = add_rn(2.f / 7, mul_rn(z, r));
  r = add_rn(2.f / 5, mul_rn(z, r));
  r = add_rn(2.f / 3, mul_rn(z, r));
  r = mul_rn(z, r);
  const float hfsq = mul_rn(0.5f, mul_rn(f, f));
  const float log1p_f = add_rn(f, -add_rn(hfsq, -mul_rn(s, add_rn(hfsq, r))));
  const float ef = static_cast<float>(e);
  float y = add_rn(mul_rn(ef, kLn2Hi), add_rn(log1p_f, mul_rn(ef, kLn2Lo)));
  y = select_bits(v == bits_as_float(0x7f800000u), v, y);  // +inf
  y = select_bits(v == 0.f, bits_as_float(0xff800000u), y);  // -inf
  y = select_bits(v < 0.f, bits_as_float(0x7fc00000u), y);
  return select_bits(v != v, v, y);
}

// tanh v = u / (u + 2) with u = e^{2|v|} - 1, written 1 - 2 / (u + 2) from
// |v| > 0.55 (u / (u + 2) would be inf / inf from |v| = 44.4), with v's sign. Within 3 ulp
// (expm1_rn's 2 pass through u / (u + 2) near 0);
// +-1 from |v| = 9.01, +-0 and NaN kept.
VQDDP_HD float tanh_rn(float v) {
  const unsigned sign = float_bits(v) & 0x80000000u;
  const float a = bits_as_float(float_bits(v) ^ sign);
  const float u = expm1_rn(add_rn(a, a));
  const float d = add_rn(u, 2.f);
  const float y = select_bits(a > 0.55f, add_rn(1.f, -div_rn(2.f, d)), div_rn(u, d));
  return bits_as_float(float_bits(y) | sign);
}

// 1 / (1 + e^-v).
VQDDP_HD float sigmoid_rn(float v) { return div_rn(1.f, add_rn(1.f, exp_rn(-v))); }

// The input formats of tensor-core products (engine/precision.h), as
// float32 values. TF32 keeps 10 of the 23 mantissa bits, rounded to nearest
// with ties away from zero (the GPU's cvt.rna.tf32.f32); bfloat16 keeps 7,
// rounded to nearest even (__float2bfloat16_rn). A carry into the exponent
// is the right result (up to +-inf past the largest finite value);
// infinities and NaN stay as they are.
VQDDP_HD float round_to_tf32(float v) {
  const unsigned b = float_bits(v);
  if ((b & 0x7f800000u) == 0x7f800000u) return v;
  return bits_as_float((b + 0x1000u) & 0xffffe000u);
}
VQDDP_HD float round_to_bf16(float v) {
  const unsigned b = float_bits(v);
  if ((b & 0x7f800000u) == 0x7f800000u) return v;
  return bits_as_float((b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u);
}

// A unary op and its derivative. `low`/`high` are clamp's bounds.
struct UnaryFn {
  // `count` is not an op: it stays last, so an op added anywhere before it
  // grows every table sized by kOps (the CPU's per-op loop tables).
  enum class Op : unsigned char { neg, square, sqrt, exp, log, relu, gelu, tanh, sigmoid, clamp, round, elu, leaky_relu, silu, abs, floor, positive, erf, sign, atan, tan, to_tf32, to_bf16, count };
  static constexpr int kOps = static_cast<int>(Op::count);
  Op op;
  // clamp's bounds; `low` is also elu's alpha and leaky_relu's negative slope.
  float low = 0.f, high = 0.f;

  // Every field, once (engine/device.h's BroadcastPlan::fields).
  auto fields() const {
    const auto& [op_, low_, high_] = *this;
    return std::tuple(op_, low_, high_);
  }

  // y = f(x)
  VQDDP_HD float f(float v) const {
    constexpr double kInvSqrt2 = 0.70710678118654752440;
    switch (op) {
      case Op::neg: return -v;
      case Op::square: return v * v;
      case Op::sqrt: return ::sqrtf(v);
      case Op::exp: return exp_rn(v);
      case Op::log: return log_rn(v);
      case Op::relu: return v > 0.f ? v : 0.f;
      case Op::gelu: return static_cast<float>(0.5 * v * (1.0 + ::erf(v * kInvSqrt2)));
      case Op::tanh: return tanh_rn(v);
      case Op::sigmoid: return sigmoid_rn(v);
      case Op::clamp: {  // std::min(std::max(v, low), high): NaN stays NaN
        float t = v < low ? low : v;
        return high < t ? high : t;
      }
      case Op::round: return ::roundf(v);  // half away from zero, as std::round
      case Op::elu: return select_bits(v > 0.f, v, low * expm1_rn(v));
      case Op::leaky_relu: return select_bits(v > 0.f, v, low * v);
      case Op::silu: return div_rn(v, add_rn(1.f, exp_rn(-v)));
      case Op::abs: return ::fabsf(v);
      case Op::floor: return ::floorf(v);
      case Op::positive: return v > 0.f ? 1.f : 0.f;
      // In double, then rounded, as gelu: the host's and CUDA's float
      // versions may differ in the last bit; the double ones almost never
      // round to different floats.
      case Op::erf: return static_cast<float>(::erf(double(v)));
      case Op::sign: return v > 0.f ? 1.f : v < 0.f ? -1.f : v;  // 0 stays 0 (and -0), NaN stays NaN
      case Op::atan: return static_cast<float>(::atan(double(v)));
      case Op::tan: return static_cast<float>(::tan(double(v)));
      case Op::to_tf32: return round_to_tf32(v);
      case Op::to_bf16: return round_to_bf16(v);
      case Op::count: break;
    }
    return 0.f;
  }

  // dy/dx from the input v and the output y (each formula reads whichever
  // is cheaper and more accurate).
  VQDDP_HD float df(float v, float y) const {
    constexpr double kInvSqrt2 = 0.70710678118654752440;
    constexpr double kInvSqrt2Pi = 0.39894228040143267794;
    constexpr double kSqrt2 = 1.41421356237309504880;
    switch (op) {
      case Op::neg: return -1.f;
      case Op::square: return 2.f * v;
      case Op::sqrt: return 0.5f / y;
      case Op::exp: return y;
      case Op::log: return 1.f / v;
      case Op::relu: return select_bits(v > 0.f, 1.f, 0.f);
      case Op::gelu: {
        double cdf = 0.5 * (1.0 + ::erf(v * kInvSqrt2));
        double pdf = kInvSqrt2Pi * ::exp(-0.5 * double(v) * v);
        return static_cast<float>(cdf + v * pdf);
      }
      case Op::tanh: return 1.f - y * y;
      case Op::sigmoid: return y * (1.f - y);
      case Op::clamp: return select_bits((v >= low) & (v <= high), 1.f, 0.f);
      case Op::round: return 0.f;  // a step function (FSQ passes the gradient straight through instead)
      case Op::elu: return select_bits(v > 0.f, 1.f, y + low);  // alpha e^v = y + alpha
      case Op::leaky_relu: return select_bits(v > 0.f, 1.f, low);
      case Op::silu: {
        float s = sigmoid_rn(v);
        return s * (1.f + v * (1.f - s));
      }
      case Op::abs: return select_bits(v > 0.f, 1.f, select_bits(v < 0.f, -1.f, 0.f));  // 0 at the kink, as PyTorch
      case Op::floor: return 0.f;     // step functions
      case Op::positive: return 0.f;
      case Op::erf: return static_cast<float>(2.0 * kInvSqrt2Pi * kSqrt2 * ::exp(-double(v) * v));  // 2/sqrt(pi) e^-v^2
      case Op::sign: return 0.f;
      case Op::atan: return static_cast<float>(1.0 / (1.0 + double(v) * v));
      case Op::tan: return static_cast<float>(1.0 + double(y) * y);
      case Op::to_tf32:  // a cast: its gradient passes through
      case Op::to_bf16: return 1.f;
      case Op::count: break;
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


// ---- optimizer updates (engine/optim.h) ---------------------------------------
//
// One element of one step. The scalars of a step are set on the host once
// (AdamW's bias corrections in double there), the per-element formula runs
// in the CPU loop and in the CUDA kernel alike.

struct SgdStep {
  float lr = 0.f, momentum = 0.f, weight_decay = 0.f;
  bool nesterov = false;
  bool first = false;  // the momentum buffers hold no value yet
  // In a kernel call: lr comes from scalars[0], on the device (uploaded
  // each step, so a captured step graph replays a changing rate).
  const float* scalars = nullptr;

  // The fields a kernel reads (engine/device.h's BroadcastPlan::fields):
  // all but lr.
  auto fields() const {
    [[maybe_unused]] const auto& [lr_unread, momentum_, weight_decay_, nesterov_, first_, scalars_] = *this;
    return std::tuple(momentum_, weight_decay_, nesterov_, first_, scalars_);
  }
};

// d = g + wd * p; with momentum buf = first ? d : momentum * buf + d and
// d = nesterov ? d + momentum * buf : buf; then p -= lr * d.
VQDDP_HD void sgd_update(const SgdStep& s, float& p, float g, float& buf) {
  float d = add_rn(g, mul_rn(s.weight_decay, p));
  if (s.momentum != 0.f) {
    buf = s.first ? d : add_rn(mul_rn(s.momentum, buf), d);
    d = s.nesterov ? add_rn(d, mul_rn(s.momentum, buf)) : buf;
  }
  p = sub_rn(p, mul_rn(s.lr, d));
}

struct AdamWStep {
  float lr = 0.f, beta1 = 0.f, beta2 = 0.f, eps = 0.f, weight_decay = 0.f;
  float c1 = 1.f;       // 1 - beta1^t
  float sqrt_c2 = 1.f;  // sqrt(1 - beta2^t)
  // In a kernel call: lr is scalars[0] and each tensor's c1 and sqrt_c2
  // are scalars[AdamWTensor::scalar] and the one after, on the device
  // (uploaded each step, so a captured step graph replays them).
  const float* scalars = nullptr;

  // The fields a kernel reads (engine/device.h's BroadcastPlan::fields):
  // all but lr, c1 and sqrt_c2.
  auto fields() const {
    [[maybe_unused]] const auto& [lr_unread, beta1_, beta2_, eps_, weight_decay_, c1_unread, sqrt_c2_unread, scalars_] =
        *this;
    return std::tuple(beta1_, beta2_, eps_, weight_decay_, scalars_);
  }
};

// Decoupled decay p -= lr * wd * p, the moments, then
// p -= lr * (m / c1) / (sqrt(v) / sqrt_c2 + eps).
VQDDP_HD void adamw_update(const AdamWStep& s, float& p, float g, float& m, float& v) {
  p = sub_rn(p, mul_rn(mul_rn(s.lr, s.weight_decay), p));
  m = add_rn(mul_rn(s.beta1, m), mul_rn(sub_rn(1.f, s.beta1), g));
  v = add_rn(mul_rn(s.beta2, v), mul_rn(mul_rn(sub_rn(1.f, s.beta2), g), g));
  p = sub_rn(p, div_rn(mul_rn(s.lr, div_rn(m, s.c1)), add_rn(div_rn(sqrt_rn(v), s.sqrt_c2), s.eps)));
}

// ---- the nearest-row search (engine/cpu/fixed_gemm_argmin.h) -------------------
//
// The score of table row j for a query row: bias_j - factor * dot, a
// product then a difference. (Its caller, the VQ assignment, passes
// |e_j|^2 and 2 for Euclidean codebooks, 0 and 1 for cosine ones.)
VQDDP_HD float nearest_score(float bias, float factor, float dot) { return sub_rn(bias, mul_rn(factor, dot)); }

// The search's candidate order: (score, row) beats the current best
// (best, best_row) when it is a candidate at all (row >= 0) and the best
// is none yet (best_row < 0), or its score is smaller, or equal with a
// lower row. Candidates come from scans that keep a score only if it is
// below +inf (strict <), so NaN and +inf are never chosen. A total order:
// any merge of partial bests (lanes, threads, tiles) picks the same row.
VQDDP_HD bool nearest_better(float score, long long row, float best, long long best_row) {
  return row >= 0 && (best_row < 0 || score < best || (score == best && row < best_row));
}

// The best index of a row of k values under arg_better's order, by a
// left-to-right scan (lowest index on ties, a number beats NaN, an all-NaN
// row gives 0): argmin/argmax on the CPU, a row's maximum on both sides.
VQDDP_HD long long best_in_row(const float* row, long long k, bool max) {
  long long best = 0;
  for (long long j = 1; j < k; ++j)
    if (arg_better(row[j], j, row[best], best, max)) best = j;
  return best;
}

// clip_grad_norm's rescaling: the product in double, rounded once.
VQDDP_HD float scale_f64(float x, double factor) { return static_cast<float>(x * factor); }

// clip_grad_norm's factor: max_norm / (norm + 1e-6), the epsilon of
// torch.nn.utils.clip_grad_norm_ so runs compare; the gradients are scaled
// only where it is below 1.
VQDDP_HD double clip_factor(double total_sq, float max_norm) { return max_norm / (::sqrt(total_sq) + 1e-6); }

// ---- the exact-sum grid (DeviceKernels::index_add_rows) -------------------------
//
// Sums that cross ranks (in vq/: a codebook's per-code sums, k-means', the
// affine moments, vq/code_stats.h) must not depend on how the rows were split or in which order a
// backend adds the ranks' partials (NCCL fixes none). Each value is first
// rounded to a grid of spacing q, a power of two agreed by every rank from
// the largest |value| of all ranks' rows: then every value, every partial
// sum and every total is an integer multiple of q below 2^53 q, so float64
// adds them EXACTLY in any order, and the result depends only on the rows.
// With max < 2^E, q = 2^(E - 27): a value keeps 27 bits below the largest
// (float32 keeps 24 of its own), and up to 2^26 rows fit (2^27 * 2^26 = 2^53).
constexpr int kGridValueBits = 27;
constexpr int kGridRowsLog2 = 26;

// q for an agreed largest magnitude; 1 when there is nothing to scale (all
// zero) or the maximum is not finite (a non-finite row refuses the step).
VQDDP_HD double grid_quantum(double max_abs) {
  if (!(max_abs > 0.0) || !(max_abs < 1.0e308)) return 1.0;
  int e = 0;
  (void)::frexp(max_abs, &e);  // max_abs = m 2^e, m in [0.5, 1): max_abs < 2^e
  return ::ldexp(1.0, e - kGridValueBits);
}

// x rounded to the nearest multiple of q (ties to even): x / q and the
// product are exact, as q is a power of two and x a float or a value of the
// same range.
VQDDP_HD double to_grid(double x, double q) { return ::rint(x / q) * q; }

}  // namespace vqddp
