// The VQ hot path on the GPU: per-code bias, the fused distance + argmin
// (on the batch-invariant GEMM's tile), and the EMA update.
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/fixed_gemm_tile.cuh"
#include "engine/cuda/grid.cuh"
#include "engine/cuda/launch.h"
#include "engine/kernel_math.h"
#include "vq/cuda/vq_launch.h"

namespace vqddp::cuda {

namespace {

// One thread per code, ascending j in double: the CPU's exact sum (the
// products of floats are exact in double), so the bias matches bitwise.
__global__ void code_bias_kernel(const float* embed, int64_t k, int64_t d, float* bias) {
  VQDDP_GRID_LOOP(c, k) {
    double acc = 0.0;
    for (int64_t j = 0; j < d; ++j) {
      double v = embed[c * d + j];
      acc = __dadd_rn(acc, __dmul_rn(v, v));
    }
    bias[c] = static_cast<float>(acc);
  }
}

// The fused assignment, step 1: one 128-row x 128-code tile of dot
// products per block (the fixed GEMM's tile, so the CPU's chains), scored
// as bias - factor * dot with explicit rounding, and reduced per row to its
// best (score, code): each thread scans its 8 codes in ascending order
// (strict <), then the 16 threads that share a row merge by shuffles. The
// n x k scores never reach global memory.
__global__ void __launch_bounds__(gemm::kGemmThreads, 2)
    assign_tiles_kernel(int64_t n, int64_t k, int64_t d, const float* __restrict__ x, const float* __restrict__ embed,
                        const float* __restrict__ bias, float factor, float* part_score, int64_t* part_code) {
  using namespace gemm;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * BM, col0 = static_cast<int64_t>(blockIdx.y) * BN;
  float acc[TM][TN];
  gemm_tile<false, true>(n, k, d, x, d, embed, d, row0, col0, acc);
  const int tx = threadIdx.x % (BN / TN), ty = threadIdx.x / (BN / TN);
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    float best = INFINITY;
    int at = -1;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      int64_t c = col0 + tile_col(j, tx);
      if (c >= k) continue;
      float score = code_score(bias[c], factor, acc[i][j]);
      if (score < best) {
        best = score;
        at = static_cast<int>(c);
      }
    }
    // The 16 threads of a row are one half-warp (tid = 16 ty + tx).
    for (int off = 8; off > 0; off /= 2) {
      float other = __shfl_xor_sync(0xffffffffu, best, off);
      int other_at = __shfl_xor_sync(0xffffffffu, at, off);
      if (code_better(other, other_at, best, at)) {
        best = other;
        at = other_at;
      }
    }
    int64_t r = row0 + tile_row(i, ty);
    if (tx == 0 && r < n) {
      part_score[r * gridDim.y + blockIdx.y] = best;
      part_code[r * gridDim.y + blockIdx.y] = at;
    }
  }
}

// Step 2: each row's per-tile bests, in ascending code order, merged.
__global__ void assign_merge_kernel(int64_t n, int64_t tiles, const float* part_score, const int64_t* part_code,
                                    int64_t* out) {
  VQDDP_GRID_LOOP(r, n) {
    float best = INFINITY;
    int at = -1;
    for (int64_t t = 0; t < tiles; ++t)
      if (code_better(part_score[r * tiles + t], part_code[r * tiles + t], best, at)) {
        best = part_score[r * tiles + t];
        at = static_cast<int>(part_code[r * tiles + t]);
      }
    out[r] = at < 0 ? 0 : at;  // only NaN or +inf scores: code 0, as on the CPU
  }
}

__global__ void ema_decay_kernel(const double* stats, float* cs, float* avg, int64_t k, int64_t d, float decay,
                                 float keep) {
  const double* counts = stats;
  const double* sums = stats + k;
  VQDDP_GRID_LOOP(i, k + k * d) {
    if (i < k)
      cs[i] = __fadd_rn(__fmul_rn(decay, cs[i]), __fmul_rn(keep, static_cast<float>(counts[i])));
    else
      avg[i - k] = __fadd_rn(__fmul_rn(decay, avg[i - k]), __fmul_rn(keep, static_cast<float>(sums[i - k])));
  }
}

// The total mass in ascending order by one thread: the CPU's exact sum (K
// adds; microseconds next to the step's GEMM).
__global__ void total_kernel(const float* cs, int64_t k, double* total) {
  double n = 0.0;
  for (int64_t c = 0; c < k; ++c) n = __dadd_rn(n, static_cast<double>(cs[c]));
  *total = n;
}

__global__ void normalise_kernel(const float* cs, const float* avg, float* embed, int64_t k, int64_t d, float eps,
                                 const double* total) {
  double n = *total;
  if (!(n > 0)) return;  // no mass anywhere: embed stays as it is
  double denom = __dadd_rn(n, __dmul_rn(static_cast<double>(k), static_cast<double>(eps)));
  VQDDP_GRID_LOOP(i, k * d) {
    int64_t c = i / d;
    float smoothed = static_cast<float>(__dmul_rn(__ddiv_rn(static_cast<double>(__fadd_rn(cs[c], eps)), denom), n));
    embed[i] = __fdiv_rn(avg[i], smoothed);
  }
}

}  // namespace

void code_bias(const float* embed, int64_t k, int64_t d, bool cosine, float* bias, cudaStream_t s) {
  if (k <= 0) return;
  if (cosine) {
    VQDDP_CUDA_CHECK(cudaMemsetAsync(bias, 0, k * sizeof(float), s));
    return;
  }
  code_bias_kernel<<<grid_for(k), kThreads, 0, s>>>(embed, k, d, bias);
  VQDDP_CUDA_CHECK_LAUNCH();
}

int64_t assign_code_tiles(int64_t k) {
  check_gemm_fixed_columns(k, "assign_codes (codes)");
  return (k + gemm::BN - 1) / gemm::BN;
}

void assign_fused(const float* x, const float* embed, const float* bias, int64_t n, int64_t k, int64_t d, float factor,
                  float* part_score, int64_t* part_code, int64_t* out, cudaStream_t s) {
  int64_t tiles = assign_code_tiles(k);
  if (n <= 0) return;
  dim3 grid(static_cast<unsigned>((n + gemm::BM - 1) / gemm::BM), static_cast<unsigned>(tiles));
  assign_tiles_kernel<<<grid, gemm::kGemmThreads, 0, s>>>(n, k, d, x, embed, bias, factor, part_score, part_code);
  VQDDP_CUDA_CHECK_LAUNCH();
  assign_merge_kernel<<<grid_for(n), kThreads, 0, s>>>(n, tiles, part_score, part_code, out);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void ema_update(const double* stats, float* cluster_size, float* embed_avg, float* embed, int64_t k, int64_t d,
                float decay, float eps, double* total, cudaStream_t s) {
  if (k <= 0) return;
  ema_decay_kernel<<<grid_for(k + k * d), kThreads, 0, s>>>(stats, cluster_size, embed_avg, k, d, decay,
                                                            1.f - decay);  // keep = 1 - decay, as on the CPU
  VQDDP_CUDA_CHECK_LAUNCH();
  total_kernel<<<1, 1, 0, s>>>(cluster_size, k, total);
  VQDDP_CUDA_CHECK_LAUNCH();
  normalise_kernel<<<grid_for(k * d), kThreads, 0, s>>>(cluster_size, embed_avg, embed, k, d, eps, total);
  VQDDP_CUDA_CHECK_LAUNCH();
}

}  // namespace vqddp::cuda
