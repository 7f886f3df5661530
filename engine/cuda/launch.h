// Launchers of the engine's CUDA kernels (kernels_*.cu), called by the
// backend (backend.cpp) on the calling thread's stream. Each returns at
// once with the work queued; sizes of 0 queue nothing.
#pragma once

#include <cuda_runtime_api.h>

#include "engine/device.h"

namespace vqddp::cuda {

void fill(void* p, DType dtype, int64_t n, double value, cudaStream_t s);
void binary(BinaryOp op, const float* a, const float* b, float* out, const BroadcastPlan& plan, cudaStream_t s);
void unary(const UnaryFn& fn, const float* x, float* out, int64_t n, cudaStream_t s);
void unary_backward(const UnaryFn& fn, const float* x, const float* y, const float* g, float* out, int64_t n,
                    cudaStream_t s);
void cast_f64_to_f32(const double* src, float* dst, int64_t n, cudaStream_t s);

void reduce_sum(const float* x, float* out, const ReducePlan& plan, cudaStream_t s);
void arg_best(const float* x, int64_t* out, float* values, int64_t rows, int64_t k, bool max, cudaStream_t s);
// result: one device unsigned long long, set to the first non-finite
// position or to ~0ull.
void first_nonfinite(const float* x, int64_t n, unsigned long long* result, cudaStream_t s);
// result: two device long longs, {min, max}.
void min_max_i64(const int64_t* x, int64_t n, long long* result, cudaStream_t s);
// *acc = max(*acc, largest finite |x[i]|), acc >= 0 (DeviceKernels::max_abs_finite).
void max_abs_finite(const float* x, int64_t n, double* acc, cudaStream_t s);
// Doubles of scratch mse needs for n, and sum_squares for its tensors.
int64_t sum_squares_scratch(int64_t n);
int64_t sum_squares_scratch(const int64_t* ns, int64_t count);
// *acc += the sum of the squares of each of count <= kMultiTensors tensors
// in turn (a device double; each tensor's fixed tree), in two launches.
void sum_squares(const float* const* xs, const int64_t* ns, int64_t count, double* scratch, double* acc,
                 cudaStream_t s);
// *out = the mean of (a[i] - b[i])^2, the difference and square in double.
void mse(const float* a, const float* b, int64_t n, double* scratch, float* out, cudaStream_t s);

// engine/cpu/fixed_gemm.h's rule (DeviceKernels::gemm_fixed), in square tiles of
// kGemmFixedTile (fixed_gemm_tile.cuh). Throws first, queuing nothing, when
// n exceeds check_gemm_fixed_columns' limit.
void gemm_fixed(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                int64_t ldb, float* c, int64_t ldc, const GemmBatch& batch, cudaStream_t s);
constexpr int64_t kGemmFixedTile = 128;
// The grid's second dimension, at most 65535 tiles, bounds the columns of
// every kernel on this tile: the GEMM's, and the fused assignment's codes
// (vq/kernels/cuda/vq_launch.h). Throws an Error naming `what` when n columns do
// not fit; host-side, defined in backend.cpp (the formatting needs g++).
void check_gemm_fixed_columns(int64_t n, const char* what);
// The grid's third dimension, at most 65535 products, bounds a batch.
void check_gemm_fixed_batch(int64_t count, const char* what);

void strided_copy(const void* src, void* dst, size_t elem_size, const StridedCopyPlan& plan, cudaStream_t s);
// count <= kMultiTensors blocks in one launch.
void copy_blocks(const CopyBlock* blocks, int64_t count, size_t elem_size, cudaStream_t s);
// At most kMultiTensors UnitSumBlocks (DeviceKernels::unit_sums), one launch.
void unit_sums(const UnitSumBlock* blocks, int64_t count, cudaStream_t s);
void gather_rows(const void* x, const int64_t* index, int64_t m, size_t row_bytes, void* out, cudaStream_t s);
void index_copy_rows(const float* src, const int64_t* index, int64_t m, int64_t d, float scale, float* dst,
                     cudaStream_t s);
// Weight normalization, one thread per row (kernel_math.h's row formulas,
// so the CPU's bits).
void weight_norm(const WeightNormTensor* tensors, int64_t count, cudaStream_t s);
void weight_norm_backward(const WeightNormTensor* tensors, int64_t count, cudaStream_t s);
// conv_plan.h's im2col and col2im (kernels_conv.cu).
void im2col(const float* x, float* cols, const ConvPlan& plan, cudaStream_t s);
void col2im(const float* cols, float* x, const ConvPlan& plan, cudaStream_t s);
// DeviceKernels::conv_fixed and its gradients: a thread per output element
// running conv_plan.h's conv_*_value (kernels_conv.cu).
void conv_fixed(const float* x, const float* w, const float* bias, int64_t cout, float* y, const ConvPlan& plan,
                cudaStream_t s);
void conv_fixed_data(const float* g, const float* w, const float* bias, int64_t cout, float* dx, const ConvPlan& plan,
                     cudaStream_t s);
void conv_fixed_weight(const float* x, const float* g, int64_t cout, float* partials, float* bias_partials,
                       const ConvPlan& plan, cudaStream_t s);
// Scratch memory index_add_rows needs for these sizes.
size_t index_add_rows_scratch(int64_t n, int64_t d, int64_t k);
// index_select's backward: float sums per code in ascending row order
// (DeviceKernels::index_add_rows_f32), with index_add_rows' scratch.
void index_add_rows_f32(const float* src, const int64_t* index, int64_t n, int64_t d, int64_t k, float* sums,
                        void* scratch, size_t scratch_bytes, cudaStream_t s);
void index_add_rows(const float* src, const int64_t* index, int64_t n, int64_t d, int64_t k, double* counts,
                    double* sums, const double* grid_max, void* scratch, size_t scratch_bytes, cudaStream_t s);

void sgd_step(const SgdStep& step, float* p, const float* g, float* buf, int64_t n, cudaStream_t s);
// count <= kMultiTensors tensors in one launch.
void adamw_step(const AdamWStep& step, const AdamWTensor* tensors, int64_t count, cudaStream_t s);
// clip_grad_norm: x scaled by clip_factor(*total_sq, max_norm) where it is
// below 1; *norm = sqrt(*total_sq) as float.
void clip_scale(float* const* xs, const int64_t* ns, int64_t count, const double* total_sq, float max_norm,
                cudaStream_t s);
void clip_norm(const double* total_sq, float* norm, cudaStream_t s);

}  // namespace vqddp::cuda
