// The batch-invariant GEMM on the GPU (engine/cpu/fixed_gemm.h's rule): each element of
// C = op(A) op(B) is one fmaf chain over k ascending from +0, the chain the
// CPU's fixed_gemm computes, so both give the same bits for every shape.
// The block tile is fixed_gemm_tile.cuh's.
#include <cuda_runtime.h>

#include "engine/cuda/cuda_check.h"
#include "engine/cuda/fixed_gemm_tile.cuh"
#include "engine/cuda/launch.h"

namespace vqddp::cuda {

namespace {

using namespace gemm;
static_assert(BM == kGemmFixedTile && BN == kGemmFixedTile, "launch.h states the tile for host-side limits");

template <bool TA, bool TB>
__global__ void __launch_bounds__(kGemmThreads, 2)
    gemm_fixed_kernel(int64_t m, int64_t n, int64_t k, const float* __restrict__ a, int64_t lda,
                      const float* __restrict__ b, int64_t ldb, float* __restrict__ c, int64_t ldc, GemmBatch batch) {
  // Product blockIdx.z of the batch: its operands and output, then the
  // one-product tile as ever (the same chains, so the same bits).
  a += blockIdx.z * batch.stride_a;
  b += blockIdx.z * batch.stride_b;
  c += blockIdx.z * batch.stride_c;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * BM, col0 = static_cast<int64_t>(blockIdx.y) * BN;
  float acc[TM][TN];
  gemm_tile<TA, TB>(m, n, k, a, lda, b, ldb, row0, col0, acc);
  const int tx = threadIdx.x % (BN / TN), ty = threadIdx.x / (BN / TN);
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    int64_t gi = row0 + tile_row(i, ty);
    if (gi >= m) continue;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      int64_t gj = col0 + tile_col(j, tx);
      if (gj < n) c[gi * ldc + gj] = acc[i][j];
    }
  }
}

}  // namespace

void gemm_fixed(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                int64_t ldb, float* c, int64_t ldc, const GemmBatch& batch, cudaStream_t s) {
  check_gemm_fixed_columns(n, "matmul");
  check_gemm_fixed_batch(batch.count, "matmul");
  if (m <= 0 || n <= 0 || k <= 0 || batch.count <= 0) return;
  dim3 grid(static_cast<unsigned>((m + BM - 1) / BM), static_cast<unsigned>((n + BN - 1) / BN),
            static_cast<unsigned>(batch.count));
  if (ta && tb)
    gemm_fixed_kernel<true, true><<<grid, kGemmThreads, 0, s>>>(m, n, k, a, lda, b, ldb, c, ldc, batch);
  else if (ta)
    gemm_fixed_kernel<true, false><<<grid, kGemmThreads, 0, s>>>(m, n, k, a, lda, b, ldb, c, ldc, batch);
  else if (tb)
    gemm_fixed_kernel<false, true><<<grid, kGemmThreads, 0, s>>>(m, n, k, a, lda, b, ldb, c, ldc, batch);
  else
    gemm_fixed_kernel<false, false><<<grid, kGemmThreads, 0, s>>>(m, n, k, a, lda, b, ldb, c, ldc, batch);
  VQDDP_CUDA_CHECK_LAUNCH();
}

}  // namespace vqddp::cuda
