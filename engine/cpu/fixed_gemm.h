// The batch-invariant matrix product on the CPU, and the choice of
// instruction set every fixed-order CPU kernel runs on (the products here,
// fixed_conv.h, fixed_gemm_argmin.h, and the unary loops of
// unary_loops.h: each compiled per set, engine/cpu/gemm_isa.h).
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
// Internal header: not installed with the library (the CPU kernels' fixed-order GEMM).
#pragma once

#include <cstdint>
#include <string>

namespace vqddp {

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

// The instruction set in use: "avx512", "avx2" or "scalar". The best the CPU
// has, unless VQDDP_CPU_ISA names another (or fixed_gemm_use_isa did);
// naming one the CPU lacks is an error.
std::string fixed_gemm_isa();
void fixed_gemm_use_isa(const std::string& name);  // for tests and benchmarks; "" = the default

}  // namespace vqddp
