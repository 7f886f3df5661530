// The VQ hot path on the GPU: per-code bias, the fused distance + argmin
// (on the batch-invariant GEMM's tile), and the EMA update.
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/fixed_gemm_tile.cuh"
#include "engine/cuda/grid.cuh"
#include "engine/cuda/launch.h"
#include "engine/kernel_math.h"
#include "vq/kernels/cuda/vq_launch.h"
#include "vq/kernels/vq_math.h"

namespace vqddp::cuda {

namespace {

// One thread per code, the CPU's formula (vq/kernels/vq_math.h code_bias), so the
// bias matches bitwise.
__global__ void code_bias_kernel(const float* embed, int64_t k, int64_t d, float* bias) {
  VQDDP_GRID_LOOP(c, k) bias[c] = ::vqddp::code_bias(embed + c * d, d);
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
      float score = nearest_score(bias[c], factor, acc[i][j]);
      if (score < best) {
        best = score;
        at = static_cast<int>(c);
      }
    }
    // The 16 threads of a row are one half-warp (tid = 16 ty + tx).
    for (int off = 8; off > 0; off /= 2) {
      float other = __shfl_xor_sync(0xffffffffu, best, off);
      int other_at = __shfl_xor_sync(0xffffffffu, at, off);
      if (nearest_better(other, other_at, best, at)) {
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
      if (nearest_better(part_score[r * tiles + t], part_code[r * tiles + t], best, at)) {
        best = part_score[r * tiles + t];
        at = static_cast<int>(part_code[r * tiles + t]);
      }
    out[r] = at < 0 ? 0 : at;  // only NaN or +inf scores: code 0, as on the CPU
  }
}

// True when some rank flagged a non-finite row (code_stats.h): the update
// kernels then change nothing. W is small; every thread reads the flags.
__device__ bool flagged(const double* flags, int world) {
  for (int r = 0; r < world; ++r)
    if (flags[r] != 0) return true;
  return false;
}

__global__ void ema_decay_kernel(const double* stats, float* cs, float* avg, int64_t k, int64_t d, float decay,
                                 float keep, const double* flags, int world) {
  if (flagged(flags, world)) return;
  const double* counts = stats;
  const double* sums = stats + k;
  VQDDP_GRID_LOOP(i, k + k * d) {
    if (i < k)
      cs[i] = ema_mix(decay, keep, cs[i], counts[i]);
    else
      avg[i - k] = ema_mix(decay, keep, avg[i - k], sums[i - k]);
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
                                 const double* total, const double* flags, int world) {
  if (flagged(flags, world)) return;
  double n = *total;
  if (!(n > 0)) return;  // no mass anywhere: embed stays as it is
  double denom = __dadd_rn(n, __dmul_rn(static_cast<double>(k), static_cast<double>(eps)));
  VQDDP_GRID_LOOP(i, k * d) {
    int64_t c = i / d;
    embed[i] = __fdiv_rn(avg[i], smoothed_size(cs[c], eps, n, denom));
  }
}

// flag = 1 + the flat position of the first non-finite element
// (first_nonfinite's, ~0 for none), or 0.
__global__ void flag_kernel(const unsigned long long* position, double* flag) {
  unsigned long long p = *position;
  *flag = p == ~0ull ? 0.0 : static_cast<double>(p) + 1.0;
}

// One block: the number of expired codes (cs < threshold, strict) and,
// per code, its rank among them (or -1): a chunked exclusive scan in code
// order, so the j-th expired code is the one the CPU's loop finds j-th.
constexpr int kScanThreads = 1024;
__global__ void expired_scan_kernel(const float* cs, int64_t k, float threshold, int64_t* position, int64_t* count) {
  __shared__ int64_t sums[kScanThreads];
  const int t = threadIdx.x;
  const int64_t chunk = (k + kScanThreads - 1) / kScanThreads, begin = t * chunk, end = min(k, begin + chunk);
  int64_t mine = 0;
  for (int64_t c = begin; c < end; ++c) mine += cs[c] < threshold;
  sums[t] = mine;
  __syncthreads();
  for (int off = 1; off < kScanThreads; off *= 2) {  // inclusive Hillis-Steele scan of the chunk counts
    int64_t add = t >= off ? sums[t - off] : 0;
    __syncthreads();
    sums[t] += add;
    __syncthreads();
  }
  int64_t at = sums[t] - mine;
  for (int64_t c = begin; c < end; ++c) position[c] = cs[c] < threshold ? at++ : -1;
  if (t == kScanThreads - 1) *count = sums[t];
}

__global__ void revival_block_kernel(const float* x, int64_t mine, int64_t k, int64_t d, const int64_t* count,
                                     int64_t total, int64_t first, const int64_t* without, const int64_t* with,
                                     float* block) {
  const int64_t expired = *count;
  VQDDP_GRID_LOOP(i, k * d) {
    int64_t j = i / d, c = i % d;
    int64_t local = j < expired ? revival_row(j, expired, total, without, with) - first : -1;
    block[i] = local >= 0 && local < mine ? x[local * d + c] : -0.f;
  }
}

__global__ void revive_kernel(const float* block, const int64_t* position, const int64_t* count, int64_t k, int64_t d,
                              float threshold, float* cs, float* avg, float* embed, double* revived,
                              const double* flags, int world) {
  if (flagged(flags, world)) return;
  VQDDP_GRID_LOOP(i, k * d) {
    int64_t c = i / d, j = position[c];
    if (j < 0) continue;
    float v = block[j * d + i % d];
    embed[i] = v;
    avg[i] = __fmul_rn(v, threshold);
    if (i % d == 0) cs[c] = threshold;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *revived = static_cast<double>(*count);
}

__global__ void kmeans_update_kernel(const double* stats, int64_t k, int64_t d, float* means, float* bins) {
  const double* counts = stats;
  const double* sums = stats + k;
  VQDDP_GRID_LOOP(i, k * d) {
    int64_t c = i / d;
    if (i % d == 0) bins[c] = static_cast<float>(counts[c]);
    if (counts[c] != 0) means[i] = static_cast<float>(__ddiv_rn(sums[i], counts[c]));  // empty: keeps its mean
  }
}

__global__ void fsq_indices_kernel(const float* codes, int64_t m, int64_t d, const float* half_width,
                                   const int64_t* basis, int64_t* out) {
  VQDDP_GRID_LOOP(i, m) {
    int64_t idx = 0;
    for (int64_t j = 0; j < d; ++j) idx += fsq_digit(codes[i * d + j], half_width[j]) * basis[j];
    out[i] = idx;
  }
}

__global__ void fsq_codes_kernel(const int64_t* indices, int64_t m, int64_t d, const int64_t* levels,
                                 const float* half_width, const int64_t* basis, float* out) {
  VQDDP_GRID_LOOP(i, m * d) {
    int64_t r = i / d, j = i % d;
    out[i] = fsq_value((indices[r] / basis[j]) % levels[j], half_width[j]);
  }
}

__global__ void lfq_indices_kernel(const float* z, int64_t n, int64_t bits, int64_t* out) {
  VQDDP_GRID_LOOP(i, n) {
    int64_t v = 0;
    for (int64_t b = 0; b < bits; ++b) v = v << 1 | (z[i * bits + b] > 0.f ? 1 : 0);
    out[i] = v;
  }
}

__global__ void lfq_codes_kernel(const int64_t* indices, int64_t n, int64_t bits, float scale, float* out) {
  VQDDP_GRID_LOOP(i, n * bits) out[i] = lfq_value(indices[i / bits], bits, i % bits, scale);
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
                float decay, float eps, double* total, int world, cudaStream_t s) {
  if (k <= 0) return;
  const double* flags = stats + k + k * d;
  ema_decay_kernel<<<grid_for(k + k * d), kThreads, 0, s>>>(stats, cluster_size, embed_avg, k, d, decay,
                                                            1.f - decay, flags, world);  // keep = 1 - decay, as on the CPU
  VQDDP_CUDA_CHECK_LAUNCH();
  total_kernel<<<1, 1, 0, s>>>(cluster_size, k, total);
  VQDDP_CUDA_CHECK_LAUNCH();
  normalise_kernel<<<grid_for(k * d), kThreads, 0, s>>>(cluster_size, embed_avg, embed, k, d, eps, total, flags,
                                                        world);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void flag_nonfinite(const float* x, int64_t n, unsigned long long* scratch, double* flag, cudaStream_t s) {
  first_nonfinite(x, n, scratch, s);
  flag_kernel<<<1, 1, 0, s>>>(scratch, flag);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void revival_candidates(const float* x, int64_t mine, const float* cs, int64_t k, int64_t d, float threshold,
                        int64_t total, int64_t first, const int64_t* without, const int64_t* with, int64_t* position,
                        int64_t* count, float* block, cudaStream_t s) {
  expired_scan_kernel<<<1, kScanThreads, 0, s>>>(cs, k, threshold, position, count);
  VQDDP_CUDA_CHECK_LAUNCH();
  revival_block_kernel<<<grid_for(k * d), kThreads, 0, s>>>(x, mine, k, d, count, total, first, without, with, block);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void revive(const float* block, float* cs, int64_t k, int64_t d, float threshold, int64_t* position, int64_t* count,
            float* avg, float* embed, double* revived, const double* flags, int world, cudaStream_t s) {
  expired_scan_kernel<<<1, kScanThreads, 0, s>>>(cs, k, threshold, position, count);
  VQDDP_CUDA_CHECK_LAUNCH();
  revive_kernel<<<grid_for(k * d), kThreads, 0, s>>>(block, position, count, k, d, threshold, cs, avg, embed, revived,
                                                     flags, world);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void kmeans_update(const double* stats, int64_t k, int64_t d, float* means, float* bins, cudaStream_t s) {
  kmeans_update_kernel<<<grid_for(k * d), kThreads, 0, s>>>(stats, k, d, means, bins);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void fsq_indices(const float* codes, int64_t m, int64_t d, const float* half_width, const int64_t* basis,
                 int64_t* out, cudaStream_t s) {
  if (m <= 0) return;
  fsq_indices_kernel<<<grid_for(m), kThreads, 0, s>>>(codes, m, d, half_width, basis, out);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void fsq_codes(const int64_t* indices, int64_t m, int64_t d, const int64_t* levels, const float* half_width,
               const int64_t* basis, float* out, cudaStream_t s) {
  if (m <= 0) return;
  fsq_codes_kernel<<<grid_for(m * d), kThreads, 0, s>>>(indices, m, d, levels, half_width, basis, out);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void lfq_indices(const float* z, int64_t n, int64_t bits, int64_t* out, cudaStream_t s) {
  if (n <= 0) return;
  lfq_indices_kernel<<<grid_for(n), kThreads, 0, s>>>(z, n, bits, out);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void lfq_codes(const int64_t* indices, int64_t n, int64_t bits, float scale, float* out, cudaStream_t s) {
  if (n <= 0) return;
  lfq_codes_kernel<<<grid_for(n * bits), kThreads, 0, s>>>(indices, n, bits, scale, out);
  VQDDP_CUDA_CHECK_LAUNCH();
}

}  // namespace vqddp::cuda
