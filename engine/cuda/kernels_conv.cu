// im2col / col2im on the GPU: one thread per (column row, channel) and one
// per image element, each running conv_plan.h's formula, the CPU loop's, so
// both devices give the same bits. The convolution without columns
// (conv_fixed and its gradients) likewise: a thread per output element and
// its conv_*_value chain, which the CPU's column path computes too.
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

__global__ void conv_fixed_kernel(const float* x, const float* w, const float* bias, int64_t cout, float* y,
                                  ConvPlan p, int64_t n) {
  VQDDP_GRID_LOOP(e, n) y[e] = conv_output_value(x, w, bias, p, cout, e);
}

__global__ void conv_fixed_data_kernel(const float* g, const float* w, const float* bias, int64_t cout, float* dx,
                                       ConvPlan p, int64_t n) {
  VQDDP_GRID_LOOP(e, n) dx[e] = conv_data_value(g, w, bias, p, cout, e);
}

// Elements past the weight's n are the bias's (when asked for): one launch.
__global__ void conv_fixed_weight_kernel(const float* x, const float* g, int64_t cout, float* partials,
                                         float* bias_partials, ConvPlan p, int64_t n, int64_t all) {
  VQDDP_GRID_LOOP(e, all) {
    if (e < n) partials[e] = conv_weight_value(x, g, p, cout, e);
    else bias_partials[e - n] = conv_bias_value(g, p, e - n);
  }
}

}  // namespace

void conv_fixed(const float* x, const float* w, const float* bias, int64_t cout, float* y, const ConvPlan& plan,
                cudaStream_t s) {
  int64_t n = plan.n * cout * plan.oh * plan.ow;
  if (n <= 0) return;
  conv_fixed_kernel<<<grid_for(n), kThreads, 0, s>>>(x, w, bias, cout, y, plan, n);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void conv_fixed_data(const float* g, const float* w, const float* bias, int64_t cout, float* dx, const ConvPlan& plan,
                     cudaStream_t s) {
  int64_t n = plan.n * plan.c * plan.h * plan.w;
  if (n <= 0) return;
  conv_fixed_data_kernel<<<grid_for(n), kThreads, 0, s>>>(g, w, bias, cout, dx, plan, n);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void conv_fixed_weight(const float* x, const float* g, int64_t cout, float* partials, float* bias_partials,
                       const ConvPlan& plan, cudaStream_t s) {
  int64_t n = plan.n * cout * plan.col_width(), all = n + (bias_partials ? plan.n * cout : 0);
  if (all <= 0) return;
  conv_fixed_weight_kernel<<<grid_for(all), kThreads, 0, s>>>(x, g, cout, partials, bias_partials, plan, n, all);
  VQDDP_CUDA_CHECK_LAUNCH();
}

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
