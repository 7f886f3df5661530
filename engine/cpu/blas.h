// The CPU BLAS: one place that knows it is OpenBLAS.
//
// Two facts about Debian's OpenBLAS 0.3.21 shape this file:
//  - It picks its kernels from a CPU table at load time. On some virtualised
//    AVX-512 machines the table does not know the CPU and falls back to a
//    generic core that is 4x slower (docs/design.md: measured 143 ms vs
//    33 ms for a 16384x256x1024 sgemm). The core can only be chosen through
//    OPENBLAS_CORETYPE before the library loads, so blas_prefer_fast_core()
//    re-executes the program once with that variable set when needed.
//  - Its thread count is process-wide. Rank threads that call sgemm
//    concurrently each want one BLAS thread, so run_ranks sets the count
//    (with ours, engine/cpu/parallel.h's cpu_set_threads) and restores it.
//  - Its kernels are not batch-invariant (a row's bits depend on the call's
//    shape), so only backward products use it; forward products go through
//    engine/cpu/fixed_gemm.h.
// Internal header: not installed with the library (the OpenBLAS calls behind the CPU kernels).
#pragma once

#include <string>

namespace vqddp {

// C = alpha * op(A) op(B) + beta * C, row-major. A is [M, K] after op, B is
// [K, N] after op; lda/ldb/ldc are the row lengths as stored.
void blas_sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

void blas_set_threads(int n);
int blas_threads();
std::string blas_core_name();  // the kernel set OpenBLAS chose, e.g. "SkylakeX"

// Call first thing in main(). If OPENBLAS_CORETYPE is unset and OpenBLAS
// chose a generic core on a CPU with AVX2/AVX-512, sets the variable to the
// matching core and re-executes /proc/self/exe with the same arguments.
// Returns normally in every other case (including when exec fails).
void blas_prefer_fast_core(char** argv);

}  // namespace vqddp
