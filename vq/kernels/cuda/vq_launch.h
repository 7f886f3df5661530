// Launchers of the VQ hot-path kernels (vq_kernels.cu), queued on the
// given stream. The float arithmetic is written with explicit rounding
// (__fmul_rn, ...) so nvcc does not contract it into FMAs: the GPU then
// computes the same float expressions as the CPU reference, bit for bit,
// wherever the inputs are the same.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace vqddp::cuda {

// bias[c] = |embed[c]|^2 (Euclidean) or 0 (cosine), summed in double.
void code_bias(const float* embed, int64_t k, int64_t d, bool cosine, float* bias, cudaStream_t s);
// out[r] = argmin_j bias[j] - factor * dot(x_r, e_j) for the rows of x (n, d)
// and codes of embed (k, d), with the CPU's fixed-order dot (engine/cpu/fixed_gemm.h),
// ties to the lowest j, NaN or +inf scores never chosen (no number: 0).
// part_score / part_code: n * assign_code_tiles(k) entries of scratch.
// k < 2^31. assign_code_tiles throws, before any work is queued, when k
// exceeds the tile grid (check_gemm_fixed_columns, engine/cuda/launch.h);
// assign_fused goes through it first.
int64_t assign_code_tiles(int64_t k);
void assign_fused(const float* x, const float* embed, const float* bias, int64_t n, int64_t k, int64_t d, float factor,
                  float* part_score, int64_t* part_code, int64_t* out, cudaStream_t s);
// The EMA step of docs/design.md section 1 on a [K + K*D] float64 stats
// buffer: cluster_size and embed_avg decay towards the batch statistics,
// then embed = embed_avg / Laplace-smoothed sizes (kept as is while the
// sizes have no mass). `total` is one device double of scratch. Nothing
// changes when one of the `world` flags after the sums is set.
void ema_update(const double* stats, float* cluster_size, float* embed_avg, float* embed, int64_t k, int64_t d,
                float decay, float eps, double* total, int world, cudaStream_t s);

// The kernels of vq/kernels/vq_kernels.h's VqKernels for CUDA (that header says
// what each computes; vq_math.h holds the formulas they share with the
// CPU). `scratch`, `position` and `count` are device scratch.
void flag_nonfinite(const float* x, int64_t n, unsigned long long* scratch, double* flag, cudaStream_t s);
void revival_candidates(const float* x, int64_t mine, const float* cs, int64_t k, int64_t d, float threshold,
                        int64_t total, int64_t first, const int64_t* without, const int64_t* with, int64_t* position,
                        int64_t* count, float* block, cudaStream_t s);
void revive(const float* block, float* cs, int64_t k, int64_t d, float threshold, int64_t* position, int64_t* count,
            float* avg, float* embed, double* revived, const double* flags, int world, cudaStream_t s);
void kmeans_update(const double* stats, int64_t k, int64_t d, float* means, float* bins, cudaStream_t s);
void fsq_indices(const float* codes, int64_t m, int64_t d, const float* half_width, const int64_t* basis,
                 int64_t* out, cudaStream_t s);
void fsq_codes(const int64_t* indices, int64_t m, int64_t d, const int64_t* levels, const float* half_width,
               const int64_t* basis, float* out, cudaStream_t s);
void lfq_indices(const float* z, int64_t n, int64_t bits, int64_t* out, cudaStream_t s);
void lfq_codes(const int64_t* indices, int64_t n, int64_t bits, float scale, float* out, cudaStream_t s);

}  // namespace vqddp::cuda
