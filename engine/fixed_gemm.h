// Batch-invariant matrix products on the CPU: the engine's forward GEMM, the
// VQ assignment's fused distance + argmin, and the stride-1 conv1d with its
// exact-step gradients; and the elementwise unary loops, on the same
// per-instruction-set tables.
//
// The rule (docs/design.md, "Forward ops are batch-invariant"): every
// output element is ONE chain of fused multiply-adds over k ascending,
//   acc = +0;  for p = 0 .. k-1:  acc = fma(A(i, p), B(p, j), acc);  C(i, j) = acc
// whatever the shape of the call, the row's position in it, the thread
// count, the tile or the instruction set (AVX-512, AVX2 or scalar std::fma;
// fma rounds once, so all three give the same bits). A row of x @ W^T thus
// has the same bits in a batch of 1 or of 4099, on one rank or split over
// eight, on any x86-64 CPU, and the CUDA kernel (cuda/kernels_fixed_gemm.cu)
// computes the same chain with fmaf, so the GPU gives the same bits too.
// BLAS libraries promise none of this (blas.h): OpenBLAS's Haswell/Zen
// kernels change a row's bits with the batch size.
//
// Backward passes outside an exact step may still use BLAS (ops_matmul.cpp);
// an exact step's gradient sums are fixed-order (engine/exact_batch.h).
// Internal header: not installed with the library (the CPU kernels' fixed-order GEMM and convolutions).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vqddp {

struct UnaryFn;  // engine/kernel_math.h

// C[m, n] = op(A) op(B), row-major, overwriting C; A(i, p) = ta ? a[p * lda + i]
// : a[i * lda + p], B(p, j) = tb ? b[j * ldb + p] : b[p * ldb + j]. k == 0
// gives zeros. Threads: cpu_threads() (parallel.h), over rows or columns,
// never over k.
void fixed_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                int64_t ldb, float* c, int64_t ldc);

// The same chains, one element at a time: the obviously correct reference
// the tests hold fixed_gemm to.
void fixed_gemm_reference(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                          const float* b, int64_t ldb, float* c, int64_t ldc);

// A 1-D convolution with stride 1 and no groups, straight from its input:
// y [n, o, lout] with lout = l + 2 pad - dil (k - 1) >= 1 and
//   y[s, j, i] = chain over p = (ch, t) ascending of w[j, ch, t] * x[s, ch, i - pad + t dil]
// (0 outside x): the fixed_gemm chain of unfold(x) [n lout, c k] times
// w^T [c k, o], so the same bits as that product, with no im2col buffer
// and the result already in [n, o, lout]. Threads: over samples and blocks
// of output channels.
void fixed_conv1d(int64_t n, int64_t c, int64_t l, const float* x, int64_t o, int64_t k, int64_t pad, int64_t dil,
                  const float* w, float* y);

// The weight gradient of fixed_conv1d as an exact step's unit partials
// (engine/exact_batch.h): partials [units, o, c k] with unit u's entry
//   chain over its rows r = (s, i) ascending of g[s, j, i] * x[s, ch, i - pad + t dil]
// for (j, (ch, t)), where g [n, o, lout] is the output's gradient and the
// units hold unit_examples consecutive samples each: the unit GEMMs of
// matmul's backward on unfold(x) and g's rows, so their bits, with no
// im2col buffer.
void fixed_conv1d_weight_units(int64_t n, int64_t c, int64_t l, const float* x, int64_t o, int64_t k, int64_t pad,
                               int64_t dil, const float* g, const std::vector<int64_t>& unit_examples,
                               float* partials);

// The input gradient of fixed_conv1d in an exact step: dx [n, c, l] from
// g [n, o, lout] and w [o, c k], each element the double sum over taps t
// ascending of the fixed chain over q ascending of g[s, q, i] w[q, ch k + t]
// (i = iy + pad - t dil, taps outside the output left out), rounded once:
// fold of the fixed_gemm product g_rows w, so its bits, with neither the
// [n lout, c k] product nor g's transpose written.
void fixed_conv1d_data(int64_t n, int64_t c, int64_t l, int64_t o, int64_t k, int64_t pad, int64_t dil, const float* g,
                       const float* w, float* dx);

// out[i] = fn.f(x[i]), and out[i] = g[i] * fn.df(x[i], y[i]) (kernel_math.h's
// UnaryFn formulas) on the widest instruction set in use: the same bits as
// the formulas themselves.
void cpu_unary(const UnaryFn& fn, const float* x, float* out, int64_t n);
void cpu_unary_backward(const UnaryFn& fn, const float* x, const float* y, const float* g, float* out, int64_t n);

// For each row x_i of x (n, d): out[i] = argmin_j bias[j] - factor * dot(x_i, e_j)
// over the codes e_j of embed (k, d), with dot the fixed_gemm chain, the
// score rounded as written (a product, then a difference), ties to the
// lowest j, scores that are NaN or +inf never chosen (no number: 0). The
// n x k scores are never stored. k < 2^31.
void fixed_gemm_argmin(int64_t n, int64_t d, int64_t k, const float* x, const float* embed, const float* bias,
                       float factor, int64_t* out);

// The instruction set in use: "avx512", "avx2" or "scalar". The best the CPU
// has, unless VQDDP_CPU_ISA names another (or fixed_gemm_use_isa did);
// naming one the CPU lacks is an error.
std::string fixed_gemm_isa();
void fixed_gemm_use_isa(const std::string& name);  // for tests and benchmarks; "" = the default

}  // namespace vqddp
