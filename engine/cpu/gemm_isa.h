// The instruction sets the fixed-order GEMM is compiled for, as a table of
// entry points per set (engine/cpu/gemm_<isa>.cpp, each compiling
// engine/cpu/gemm_kernel.h for its set). engine/cpu/fixed_gemm.cpp picks
// one at run time and spreads the work over threads.
//
// Every entry gives the same bits on every set; they differ in speed only:
// the products (gemm, argmin, the conv1d entries) compute each element as
// the same chain of fused multiply-adds over k ascending from +0
// (fixed_gemm.h), conv1d_data adds such chains into double sums in a fixed
// order, and the unary loops are kernel_math.h's formulas with every
// operation as written (no contraction).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/kernel_math.h"

namespace vqddp::cpu {

namespace {  // each including file's own copy

// Grow-only scratch, one per thread and use: returns n elements of v,
// resizing only when v is smaller; the contents are whatever was there.
template <class T>
T* scratch(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  return v.data();
}

}  // namespace

// C[m, n] = op(A) op(B), row-major; A(i, p) = ta ? a[p * lda + i] : a[i * lda + p],
// B(p, j) = tb ? b[j * ldb + p] : b[p * ldb + j]. m, n, k > 0.
struct GemmArgs {
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0;
  const float* a = nullptr;
  int64_t lda = 0;
  const float* b = nullptr;
  int64_t ldb = 0;
  float* c = nullptr;
  int64_t ldc = 0;
};

// For rows x[r, :] (row-major, d floats each) of one task:
//   out[r] = argmin_j bias[j] - factor * dot(x_r, e_j), ties to the lowest j,
// over table rows whose score is a number below +inf (none: 0). `packed` is the
// table as pack_codes() laid it out; `bias` has panels * nr entries, the
// padding NaN so it is never chosen.
struct ArgminArgs {
  int64_t rows = 0, d = 0, panels = 0;
  const float* x = nullptr;
  const float* packed = nullptr;
  const float* bias = nullptr;
  float factor = 1.f;
  int64_t* out = nullptr;
};

// One output row of a convolution whose width stride is 1 (conv1d_sample
// in gemm_kernel.h): output channels [o_begin, o_end) of the row's lout
// positions, y[o * y_stride + j], from the weight w [o, ck] and the
// zero-padded input xp, column p of the implicit im2col matrix starting at
// xp + off[p]. o_begin is a multiple of mr.
struct Conv1dArgs {
  int64_t o_begin = 0, o_end = 0, ck = 0, lout = 0, y_stride = 0;
  const float* xp = nullptr;
  const int64_t* off = nullptr;
  const float* w = nullptr;
  float* y = nullptr;
};

// The weight gradient of one unit of a convolution (its "samples" are runs
// of lout positions, sample_stride floats apart in the padded input: a 2-D
// convolution's output rows; a width-strided one's input in phases, so a
// tap's positions are consecutive floats), as the fixed-order product of
// unit_partials_of_b (conv1d_weight in gemm_kernel.h): columns [j_begin,
// j_end) of out [cout, ck], out[q, j] = chain over the unit's rows r = (s,
// i) ascending of fma(xp_s[off[j] + i], g[r, q], acc). g has o_pad floats
// a row (zero past cout), o_pad a multiple of nr, or nr / 2 (one vector)
// where cout is at most that; j_begin a multiple of mr.
struct Conv1dWeightArgs {
  int64_t j_begin = 0, j_end = 0, o_pad = 0, samples = 0, lout = 0, sample_stride = 0;
  int64_t cout = 0, ck = 0;
  const float* xp = nullptr;  // the unit's first run's padded input
  const int64_t* off = nullptr;
  const float* g = nullptr;   // the unit's first row
  float* out = nullptr;       // [cout, ck]
};

// The input gradient of a convolution whose width stride is 1, for one
// input row (conv1d_data in gemm_kernel.h): for channels [ch_begin, ch_end)
// and positions ix in [0, l), the double sum over the row's taps in the
// order given of each tap's fixed chain over q ascending of
// fma(gp[t][q * lg + ix], w[q * ck + ch * k + tap[t]], acc), rounded to
// float into dx[ch * dx_stride + ix]. gp[t] is the sample's gradient rows,
// zero-padded and already shifted for tap t; ch_begin a multiple of mr.
// The sums stay across the taps in registers, or, where a tap's chains
// are long enough to pay for it (AVX2 from 4 output channels), in an L1
// tile that lets more channels' chains run at once (gemm_kernel.h).
struct Conv1dDataArgs {
  int64_t ch_begin = 0, ch_end = 0, o = 0, l = 0, lg = 0, ck = 0, k = 0;
  int64_t taps = 0;
  const int64_t* tap = nullptr;      // each tap's index in the kernel, ky kw + kx
  const float* const* gp = nullptr;  // and its gradient rows
  const float* w = nullptr;
  float* dx = nullptr;
  int64_t dx_stride = 0;
};

struct GemmIsa {
  const char* name;
  int mr, nr;  // register tile: rows of A, columns of B
  void (*gemm)(const GemmArgs& args);
  // embed (k, d) row-major -> panels of nr rows, each (d, nr); `out` holds
  // ceil(k / nr) * nr * d floats, rows past k are zero.
  void (*pack_codes)(const float* embed, int64_t k, int64_t d, float* out);
  void (*argmin)(const ArgminArgs& args);
  void (*conv1d)(const Conv1dArgs& args);
  void (*conv1d_weight)(const Conv1dWeightArgs& args);
  void (*conv1d_data)(const Conv1dDataArgs& args);
  // b[c * ldb + r] = a[r * lda + c] for r < rows, c < cols: a block
  // transposition (8 x 8 in registers where the set has vectors), the
  // direct convolutions' reshuffles between channel-major and
  // position-major layouts. Moves floats, computes none.
  void (*transpose)(const float* a, int64_t lda, int64_t rows, int64_t cols, float* b, int64_t ldb);
  // Per UnaryFn op (indexed by it): out[i] = f(x[i]), and out[i] = g[i] *
  // df(x[i], y[i]), kernel_math.h's formulas compiled for the set (the same
  // bits on every set: no FMA contraction, every operation as written).
  using UnaryLoop = void (*)(const UnaryFn& fn, const float* x, float* out, int64_t n);
  using UnaryBackwardLoop = void (*)(const UnaryFn& fn, const float* x, const float* y, const float* g, float* out,
                                     int64_t n);
  const UnaryLoop* unary;
  const UnaryBackwardLoop* unary_backward;
  // kernel_math.h's adamw_update over n elements of one tensor, compiled
  // for the set: its two divisions and square root are correctly rounded
  // in every lane, so vectors give the bits of the scalar formula.
  void (*adamw)(const AdamWStep& s, float* p, const float* g, float* m, float* v, int64_t n);
};

extern const GemmIsa gemm_isa_avx512;  // AVX-512F + FMA: 8 x 32 tile
extern const GemmIsa gemm_isa_avx2;    // AVX2 + FMA: 6 x 16 tile
extern const GemmIsa gemm_isa_scalar;  // std::fma: any CPU

// The set in use (fixed_gemm.h fixed_gemm_isa names it), and the fastest
// for a product of n columns: every set gives the same bits, and for 16 or
// fewer columns AVX2's 16-wide tile wastes none of the work AVX-512's
// 32-wide one would (fixed_gemm.cpp).
const GemmIsa& active_isa();
const GemmIsa& isa_for_columns(int64_t n);

}  // namespace vqddp::cpu
