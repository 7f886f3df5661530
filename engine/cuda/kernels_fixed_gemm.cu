// The batch-invariant GEMM on the GPU (fixed_gemm.h's rule): each element of
// C = op(A) op(B) is one fmaf chain over k ascending from +0, the chain the
// CPU's fixed_gemm computes, so both give the same bits for every shape.
//
// Fixed 128 x 128 block tiles, 8 x 8 outputs per thread, k in steps of 8
// through shared memory, and never split-K: a thread owns its outputs for
// the whole of k. The k loop runs only over real k (no zero padding in k:
// fma(0, 0, -0) is +0, so a padded step could flip the sign of a zero).
#include <cuda_runtime.h>

#include "engine/cuda/cuda_check.h"
#include "engine/cuda/launch.h"

namespace vqddp::cuda {

namespace {

constexpr int BM = 128, BN = 128, BK = 8, TM = 8, TN = 8;
constexpr int kGemmThreads = (BM / TM) * (BN / TN);  // 256

template <bool TA, bool TB>
__global__ void __launch_bounds__(kGemmThreads)
    gemm_fixed_kernel(int64_t m, int64_t n, int64_t k, const float* __restrict__ a, int64_t lda,
                      const float* __restrict__ b, int64_t ldb, float* __restrict__ c, int64_t ldc) {
  __shared__ __align__(16) float as[BK][BM];  // A tile, k-major
  __shared__ __align__(16) float bs[BK][BN];
  const int tid = threadIdx.x, tx = tid % (BN / TN), ty = tid / (BN / TN);
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * BM, col0 = static_cast<int64_t>(blockIdx.y) * BN;
  float acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

  for (int64_t k0 = 0; k0 < k; k0 += BK) {
    // Each thread loads 4 elements of each tile; consecutive threads read
    // consecutive addresses of the operand's stored rows.
#pragma unroll
    for (int q = 0; q < BM * BK / kGemmThreads; ++q) {
      int e = tid + q * kGemmThreads;
      int r = TA ? e % BM : e / BK, kk = TA ? e / BM : e % BK;
      int64_t gi = row0 + r, gk = k0 + kk;
      as[kk][r] = gi < m && gk < k ? (TA ? a[gk * lda + gi] : a[gi * lda + gk]) : 0.f;
    }
#pragma unroll
    for (int q = 0; q < BN * BK / kGemmThreads; ++q) {
      int e = tid + q * kGemmThreads;
      int j = TB ? e / BK : e % BN, kk = TB ? e % BK : e / BN;
      int64_t gj = col0 + j, gk = k0 + kk;
      bs[kk][j] = gj < n && gk < k ? (TB ? b[gj * ldb + gk] : b[gk * ldb + gj]) : 0.f;
    }
    __syncthreads();
    int steps = k - k0 < BK ? static_cast<int>(k - k0) : BK;
    for (int kk = 0; kk < steps; ++kk) {
      float av[TM], bv[TN];
      // Thread (ty, tx) owns rows 4 ty + {0..3} and 64 + 4 ty + {0..3}, and the
      // same pattern of columns: four 16-byte shared-memory reads per step,
      // which a half-warp serves without bank conflicts.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float4 a4 = *reinterpret_cast<const float4*>(&as[kk][h * (BM / 2) + 4 * ty]);
        float4 b4 = *reinterpret_cast<const float4*>(&bs[kk][h * (BN / 2) + 4 * tx]);
        av[4 * h] = a4.x, av[4 * h + 1] = a4.y, av[4 * h + 2] = a4.z, av[4 * h + 3] = a4.w;
        bv[4 * h] = b4.x, bv[4 * h + 1] = b4.y, bv[4 * h + 2] = b4.z, bv[4 * h + 3] = b4.w;
      }
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = __fmaf_rn(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    int64_t gi = row0 + (i / 4) * (BM / 2) + 4 * ty + i % 4;
    if (gi >= m) continue;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      int64_t gj = col0 + (j / 4) * (BN / 2) + 4 * tx + j % 4;
      if (gj < n) c[gi * ldc + gj] = acc[i][j];
    }
  }
}

}  // namespace

void gemm_fixed(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                int64_t ldb, float* c, int64_t ldc, cudaStream_t s) {
  if (m <= 0 || n <= 0 || k <= 0) return;
  dim3 grid(static_cast<unsigned>((m + BM - 1) / BM), static_cast<unsigned>((n + BN - 1) / BN));
  if (ta && tb)
    gemm_fixed_kernel<true, true><<<grid, kGemmThreads, 0, s>>>(m, n, k, a, lda, b, ldb, c, ldc);
  else if (ta)
    gemm_fixed_kernel<true, false><<<grid, kGemmThreads, 0, s>>>(m, n, k, a, lda, b, ldb, c, ldc);
  else if (tb)
    gemm_fixed_kernel<false, true><<<grid, kGemmThreads, 0, s>>>(m, n, k, a, lda, b, ldb, c, ldc);
  else
    gemm_fixed_kernel<false, false><<<grid, kGemmThreads, 0, s>>>(m, n, k, a, lda, b, ldb, c, ldc);
  VQDDP_CUDA_CHECK_LAUNCH();
}

}  // namespace vqddp::cuda
