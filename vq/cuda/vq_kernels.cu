// The VQ hot path on the GPU: per-code bias, the fused argmin that follows
// each cuBLAS block of dot products, and the EMA update.
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/grid.cuh"
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

// One warp per row. Each lane keeps its first minimum over j = lane mod 32
// (strict <), and the shuffle tree merges (score, index) pairs by score,
// then lower index: the CPU's 16-lane scan under the same total order.
__global__ void argmin_scores_kernel(const float* bias, const float* dots, int64_t rows, int64_t k, float factor,
                                     int64_t* out) {
  int lane = threadIdx.x % 32;
  int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  for (int64_t r = warp; r < rows; r += warps) {
    const float* row = dots + r * k;
    float best = INFINITY;
    long long at = -1;
    for (int64_t j = lane; j < k; j += 32) {
      float s = __fsub_rn(bias[j], __fmul_rn(factor, row[j]));
      if (s < best) {
        best = s;
        at = j;
      }
    }
    for (int off = 16; off > 0; off /= 2) {
      float ob = __shfl_xor_sync(0xffffffffu, best, off);
      long long oa = __shfl_xor_sync(0xffffffffu, at, off);
      bool take = oa >= 0 && (at < 0 || ob < best || (ob == best && oa < at));
      if (take) {
        best = ob;
        at = oa;
      }
    }
    if (lane == 0) out[r] = at < 0 ? 0 : at;
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

void argmin_scores(const float* bias, const float* dots, int64_t rows, int64_t k, float factor, int64_t* out,
                   cudaStream_t s) {
  if (rows <= 0) return;
  argmin_scores_kernel<<<grid_for(rows * 32), kThreads, 0, s>>>(bias, dots, rows, k, factor, out);
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
