// The block tile of the GPU's batch-invariant GEMM, shared by the plain
// GEMM (kernels_fixed_gemm.cu) and the fused VQ assignment
// (vq/kernels/cuda/vq_kernels.cu), so both compute the same chains.
//
// Fixed 128 x 128 block tiles, 8 x 8 outputs per thread, k in steps of 16
// through double-buffered shared memory, and never split-K: a thread owns
// its outputs for the whole of k, so tiles change speed, never bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace vqddp::cuda::gemm {

constexpr int BM = 128, BN = 128, BK = 16, TM = 8, TN = 8;
constexpr int kGemmThreads = (BM / TM) * (BN / TN);  // 256
// Shared-memory rows padded by 4 floats: the k-major stores of a row-major
// operand then spread over the banks, and rows stay 16-byte aligned.
constexpr int kPad = 4;
constexpr int kLoads = BM * BK / kGemmThreads;  // elements per thread per tile and operand (8)
static_assert(BM == BN, "one loader shape serves both operands");

// One operand's 128 lines (rows of A, columns of B) x BK of k, from global
// memory to a k-major shared tile. KC: the stored rows run along k (A not
// transposed, B transposed); else along the lines. Consecutive threads read
// consecutive addresses either way. Thread t holds elements (line + dl q,
// kk + dk q), q < kLoads; the address arithmetic is set up once.
template <bool KC>
struct TileLoader {
  static constexpr int kDl = KC ? kGemmThreads / BK : 0, kDk = KC ? 0 : kGemmThreads / BM;
  const float* p;      // element (line, kk) at k0 = 0
  int64_t ld, rem, k;  // rem: lines from this thread's first to the operand's end
  int line, kk;

  __device__ TileLoader(const float* base, int64_t ld_, int64_t lines, int64_t k_, int64_t line0, int tid)
      : ld(ld_), k(k_) {
    line = KC ? tid / BK : tid % BM;
    kk = KC ? tid % BK : tid / BM;
    p = base + (KC ? (line0 + line) * ld + kk : kk * ld + line0 + line);
    rem = lines - line0 - line;
  }
  __device__ __forceinline__ void load(int64_t k0, float (&v)[kLoads]) const {
    const float* at = p + (KC ? k0 : k0 * ld);
#pragma unroll
    for (int q = 0; q < kLoads; ++q) {
      bool ok = kDl * q < rem && k0 + kk + kDk * q < k;
      v[q] = ok ? at[KC ? kDl * q * ld : kDk * q * ld] : 0.f;
    }
  }
  __device__ __forceinline__ void store(float (*tile)[BM + kPad], const float (&v)[kLoads]) const {
#pragma unroll
    for (int q = 0; q < kLoads; ++q) tile[kk + kDk * q][line + kDl * q] = v[q];
  }
};

// C tile at (row0, col0) of op(A) op(B) into `acc`: thread (ty, tx) of the
// 16 x 16 block owns rows tile_row(i) and columns tile_col(j). Every element
// is one __fmaf_rn chain over k ascending from +0 (engine/cpu/fixed_gemm.h's rule).
template <bool TA, bool TB>
__device__ __forceinline__ void gemm_tile(int64_t m, int64_t n, int64_t k, const float* __restrict__ a, int64_t lda,
                                          const float* __restrict__ b, int64_t ldb, int64_t row0, int64_t col0,
                                          float (&acc)[TM][TN]) {
  __shared__ __align__(16) float as[2][BK][BM + kPad];  // A tiles, k-major, double-buffered
  __shared__ __align__(16) float bs[2][BK][BN + kPad];
  const int tid = threadIdx.x, tx = tid % (BN / TN), ty = tid / (BN / TN);
  const TileLoader<!TA> la(a, lda, m, k, row0, tid);
  const TileLoader<TB> lb(b, ldb, n, k, col0, tid);
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

  // The next tile travels global -> registers while this one is computed,
  // then registers -> the other shared buffer: one barrier per tile.
  float pa[kLoads], pb[kLoads];
  la.load(0, pa);
  lb.load(0, pb);
  la.store(as[0], pa);
  lb.store(bs[0], pb);
  __syncthreads();
  int buf = 0;
  for (int64_t k0 = 0; k0 < k; k0 += BK) {
    bool more = k0 + BK < k;
    if (more) {
      la.load(k0 + BK, pa);
      lb.load(k0 + BK, pb);
    }
    // Only real k: no zero padding in k (fma(0, 0, -0) is +0, so a padded
    // step could flip the sign of a zero).
    int steps = k - k0 < BK ? static_cast<int>(k - k0) : BK;
    for (int kk = 0; kk < steps; ++kk) {
      float av[TM], bv[TN];
      // Four 16-byte shared-memory reads per step, which a half-warp serves
      // without bank conflicts.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float4 a4 = *reinterpret_cast<const float4*>(&as[buf][kk][h * (BM / 2) + 4 * ty]);
        float4 b4 = *reinterpret_cast<const float4*>(&bs[buf][kk][h * (BN / 2) + 4 * tx]);
        av[4 * h] = a4.x, av[4 * h + 1] = a4.y, av[4 * h + 2] = a4.z, av[4 * h + 3] = a4.w;
        bv[4 * h] = b4.x, bv[4 * h + 1] = b4.y, bv[4 * h + 2] = b4.z, bv[4 * h + 3] = b4.w;
      }
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = __fmaf_rn(av[i], bv[j], acc[i][j]);
    }
    if (more) {
      la.store(as[buf ^ 1], pa);
      lb.store(bs[buf ^ 1], pb);
    }
    __syncthreads();
    buf ^= 1;
  }
}

// Thread (ty, tx) owns rows 4 ty + {0..3} and 64 + 4 ty + {0..3} of the tile,
// and the same pattern of columns (ascending in i and in j).
__device__ __forceinline__ int tile_row(int i, int ty) { return (i / 4) * (BM / 2) + 4 * ty + i % 4; }
__device__ __forceinline__ int tile_col(int j, int tx) { return (j / 4) * (BN / 2) + 4 * tx + j % 4; }

}  // namespace vqddp::cuda::gemm
