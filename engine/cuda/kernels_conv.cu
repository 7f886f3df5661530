// im2col / col2im on the GPU: one thread per (column row, channel) and one
// per image element, each running conv_plan.h's formula, the CPU loop's, so
// both devices give the same bits.
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/grid.cuh"
#include "engine/cuda/launch.h"

namespace vqddp::cuda {

namespace {

__global__ void im2col_kernel(const float* x, float* cols, ConvPlan p) {
  VQDDP_GRID_LOOP(i, p.rows() * p.c) im2col_taps(x, p, i / p.c, i % p.c, cols);
}

__global__ void col2im_kernel(const float* cols, float* x, ConvPlan p, int64_t n) {
  VQDDP_GRID_LOOP(e, n) x[e] = col2im_value(cols, p, e);
}

}  // namespace

void im2col(const float* x, float* cols, const ConvPlan& plan, cudaStream_t s) {
  int64_t n = plan.rows() * plan.c;
  if (n <= 0) return;
  im2col_kernel<<<grid_for(n), kThreads, 0, s>>>(x, cols, plan);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void col2im(const float* cols, float* x, const ConvPlan& plan, cudaStream_t s) {
  int64_t n = plan.n * plan.c * plan.h * plan.w;
  if (n <= 0) return;
  col2im_kernel<<<grid_for(n), kThreads, 0, s>>>(cols, x, plan, n);
  VQDDP_CUDA_CHECK_LAUNCH();
}

}  // namespace vqddp::cuda
