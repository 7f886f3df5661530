// Elementwise and data-movement kernels. The math is kernel_math.h's, the
// same functions the CPU loops call.
#include <algorithm>

#include "engine/cuda/cuda_check.h"
#include "engine/cuda/grid.cuh"
#include "engine/cuda/launch.h"

namespace vqddp::cuda {

namespace {

template <class T>
__global__ void fill_kernel(T* p, int64_t n, T value) {
  VQDDP_GRID_LOOP(i, n) p[i] = value;
}

// Offset in an operand of output element i, from the plan's strides.
__device__ __forceinline__ void broadcast_offsets(const BroadcastPlan& plan, int64_t i, int64_t& oa, int64_t& ob) {
  oa = 0;
  ob = 0;
  for (int d = plan.ndim - 1; d >= 0; --d) {
    int64_t c = i % plan.shape[d];
    i /= plan.shape[d];
    oa += c * plan.stride_a[d];
    ob += c * plan.stride_b[d];
  }
}

__global__ void binary_kernel(BinaryOp op, const float* a, const float* b, float* out, int64_t n, BroadcastPlan plan,
                              bool dense) {
  VQDDP_GRID_LOOP(i, n) {
    if (dense) {
      out[i] = apply_binary(op, a[i], b[i]);
    } else {
      int64_t oa, ob;
      broadcast_offsets(plan, i, oa, ob);
      out[i] = apply_binary(op, a[oa], b[ob]);
    }
  }
}

__global__ void unary_kernel(UnaryFn fn, const float* x, float* out, int64_t n) {
  VQDDP_GRID_LOOP(i, n) out[i] = fn.f(x[i]);
}

__global__ void unary_backward_kernel(UnaryFn fn, const float* x, const float* y, const float* g, float* out,
                                      int64_t n) {
  VQDDP_GRID_LOOP(i, n) out[i] = g[i] * fn.df(x[i], y[i]);
}

__global__ void cast_kernel(const double* src, float* dst, int64_t n) {
  VQDDP_GRID_LOOP(i, n) dst[i] = static_cast<float>(src[i]);
}

template <class Word>
__global__ void strided_copy_kernel(const Word* src, Word* dst, int64_t n, StridedCopyPlan plan) {
  VQDDP_GRID_LOOP(i, n) {
    int64_t rem = i, so = 0, dso = 0;
    for (int d = plan.ndim - 1; d >= 0; --d) {
      int64_t c = rem % plan.shape[d];
      rem /= plan.shape[d];
      so += c * plan.src_stride[d];
      dso += c * plan.dst_stride[d];
    }
    dst[dso] = src[so];
  }
}

// Up to kMultiTensors 2-D copies (or zero fills, src null), block row
// blockIdx.y doing copy blockIdx.y, in 32-bit words (sizes and strides
// already in words).
struct CopyList {
  CopyBlock b[kMultiTensors];
};

__global__ void copy_blocks_kernel(CopyList list) {
  const CopyBlock& c = list.b[blockIdx.y];
  const auto* src = static_cast<const uint32_t*>(c.src);
  auto* dst = static_cast<uint32_t*>(c.dst);
  VQDDP_GRID_LOOP(i, c.rows * c.width) {
    int64_t r = i / c.width, col = i % c.width;
    dst[r * c.dst_row + col] = src ? src[r * c.src_row + col] : 0u;
  }
}

// Rows are copied as 32-bit words: every dtype is a multiple of 4 bytes and
// a row view's offset keeps 4-byte alignment.
__global__ void gather_rows_kernel(const uint32_t* x, const int64_t* index, int64_t m, int64_t words, uint32_t* out) {
  VQDDP_GRID_LOOP(i, m * words) {
    int64_t r = i / words, w = i % words;
    out[i] = x[index[r] * words + w];
  }
}

__global__ void index_copy_rows_kernel(const float* src, const int64_t* index, int64_t m, int64_t d, float scale,
                                       float* dst) {
  VQDDP_GRID_LOOP(i, m * d) {
    int64_t r = i / d, j = i % d;
    dst[index[r] * d + j] = src[i] * scale;
  }
}

__global__ void sgd_step_kernel(SgdStep step, float* p, const float* g, float* buf, int64_t n) {
  step.lr = step.scalars[0];
  VQDDP_GRID_LOOP(i, n) sgd_update(step, p[i], g[i], buf[i]);
}

// Multi-tensor kernels: the tensors travel in the arguments (at most
// kMultiTensors: about 3 KiB of the 4 KiB a launch may pass); block row
// blockIdx.y works on tensor blockIdx.y, its columns grid-stride over it.
struct AdamWList {
  AdamWTensor t[kMultiTensors];
};
struct ScaleList {
  float* x[kMultiTensors];
  int64_t n[kMultiTensors];
};

struct UnitSumList {
  UnitSumBlock b[kMultiTensors];
};

// A thread per column of block blockIdx.y: its units in ascending order,
// in double (the CPU's loop, the same bits).
__global__ void unit_sums_kernel(UnitSumList list) {
  const UnitSumBlock& u = list.b[blockIdx.y];
  VQDDP_GRID_LOOP(j, u.n) {
    double acc = 0.0;
    for (int64_t r = 0; r < u.units; ++r) acc += u.in[r * u.n + j];
    u.out[j] = static_cast<float>(acc);
  }
}

__global__ void adamw_step_kernel(AdamWStep step, AdamWList list) {
  const AdamWTensor& a = list.t[blockIdx.y];
  step.lr = step.scalars[0];
  step.c1 = step.scalars[a.scalar];
  step.sqrt_c2 = step.scalars[a.scalar + 1];
  VQDDP_GRID_LOOP(i, a.n) adamw_update(step, a.p[i], a.g[i], a.m[i], a.v[i]);
}

// A thread per row: its sums in the CPU's ascending order (the rows of a
// layer's weight are few and short, and the step launches this once).
// Layers as block rows (blockIdx.y), like the other multi-tensor kernels;
// each direction's list holds only its pointers, to stay within the
// launch's argument space.
struct WeightNormForward {
  const float *v, *g;
  float* w;
  int64_t rows, cols;
};
struct WeightNormBackward {
  const float *v, *g, *dw;
  float *dv, *dg;
  int64_t rows, cols;
};
struct WeightNormForwardList {
  WeightNormForward t[kMultiTensors];
};
struct WeightNormBackwardList {
  WeightNormBackward t[kMultiTensors];
};

__global__ void weight_norm_kernel(WeightNormForwardList list) {
  const WeightNormForward& a = list.t[blockIdx.y];
  VQDDP_GRID_LOOP(r, a.rows) weight_norm_rows<1>(a.v + r * a.cols, a.g + r, a.cols, a.w + r * a.cols);
}

__global__ void weight_norm_backward_kernel(WeightNormBackwardList list) {
  const WeightNormBackward& a = list.t[blockIdx.y];
  VQDDP_GRID_LOOP(r, a.rows)
  weight_norm_rows_backward<1>(a.v + r * a.cols, a.g + r, a.dw + r * a.cols, a.cols, a.dv + r * a.cols, a.dg + r);
}

__global__ void clip_scale_kernel(ScaleList list, const double* total_sq, float max_norm) {
  const double factor = clip_factor(*total_sq, max_norm);
  if (!(factor < 1.0)) return;
  float* x = list.x[blockIdx.y];
  VQDDP_GRID_LOOP(i, list.n[blockIdx.y]) x[i] = vqddp::scale_f64(x[i], factor);
}

__global__ void clip_norm_kernel(const double* total_sq, float* norm) { *norm = static_cast<float>(sqrt(*total_sq)); }

int64_t plan_numel(const int64_t* shape, int ndim) {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

}  // namespace

void fill(void* p, DType dtype, int64_t n, double value, cudaStream_t s) {
  if (n <= 0) return;
  switch (dtype) {
    case DType::f32: fill_kernel<<<grid_for(n), kThreads, 0, s>>>(static_cast<float*>(p), n, static_cast<float>(value)); break;
    case DType::i64: fill_kernel<<<grid_for(n), kThreads, 0, s>>>(static_cast<int64_t*>(p), n, static_cast<int64_t>(value)); break;
    case DType::f64: fill_kernel<<<grid_for(n), kThreads, 0, s>>>(static_cast<double*>(p), n, value); break;
  }
  VQDDP_CUDA_CHECK_LAUNCH();
}

void binary(BinaryOp op, const float* a, const float* b, float* out, const BroadcastPlan& plan, cudaStream_t s) {
  int64_t n = plan_numel(plan.shape, plan.ndim);
  if (n <= 0) return;
  // Dense fast path: both operands have the output's row-major strides.
  bool dense = true;
  int64_t stride = 1;
  for (int d = plan.ndim - 1; d >= 0; --d) {
    if (plan.shape[d] != 1) dense = dense && plan.stride_a[d] == stride && plan.stride_b[d] == stride;
    stride *= plan.shape[d];
  }
  binary_kernel<<<grid_for(n), kThreads, 0, s>>>(op, a, b, out, n, plan, dense);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void unary(const UnaryFn& fn, const float* x, float* out, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  unary_kernel<<<grid_for(n), kThreads, 0, s>>>(fn, x, out, n);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void unary_backward(const UnaryFn& fn, const float* x, const float* y, const float* g, float* out, int64_t n,
                    cudaStream_t s) {
  if (n <= 0) return;
  unary_backward_kernel<<<grid_for(n), kThreads, 0, s>>>(fn, x, y, g, out, n);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void cast_f64_to_f32(const double* src, float* dst, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  cast_kernel<<<grid_for(n), kThreads, 0, s>>>(src, dst, n);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void strided_copy(const void* src, void* dst, size_t elem_size, const StridedCopyPlan& plan, cudaStream_t s) {
  int64_t n = plan_numel(plan.shape, plan.ndim);
  if (n <= 0) return;
  if (elem_size == 8)
    strided_copy_kernel<<<grid_for(n), kThreads, 0, s>>>(static_cast<const uint64_t*>(src), static_cast<uint64_t*>(dst), n, plan);
  else
    strided_copy_kernel<<<grid_for(n), kThreads, 0, s>>>(static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst), n, plan);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void copy_blocks(const CopyBlock* blocks, int64_t count, size_t elem_size, cudaStream_t s) {
  CopyList list;
  const int64_t words = static_cast<int64_t>(elem_size / 4);
  int64_t most = 0;
  for (int64_t t = 0; t < count; ++t) {
    CopyBlock c = blocks[t];
    c.width *= words;
    c.src_row *= words;
    c.dst_row *= words;
    list.b[t] = c;
    most = std::max(most, c.rows * c.width);
  }
  if (count <= 0 || most <= 0) return;
  copy_blocks_kernel<<<dim3(grid_for(most), static_cast<unsigned>(count)), kThreads, 0, s>>>(list);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void gather_rows(const void* x, const int64_t* index, int64_t m, size_t row_bytes, void* out, cudaStream_t s) {
  int64_t words = static_cast<int64_t>(row_bytes / 4);
  if (m <= 0 || words <= 0) return;
  gather_rows_kernel<<<grid_for(m * words), kThreads, 0, s>>>(static_cast<const uint32_t*>(x), index, m, words,
                                                              static_cast<uint32_t*>(out));
  VQDDP_CUDA_CHECK_LAUNCH();
}

void index_copy_rows(const float* src, const int64_t* index, int64_t m, int64_t d, float scale, float* dst,
                     cudaStream_t s) {
  if (m <= 0 || d <= 0) return;
  index_copy_rows_kernel<<<grid_for(m * d), kThreads, 0, s>>>(src, index, m, d, scale, dst);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void sgd_step(const SgdStep& step, float* p, const float* g, float* buf, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  sgd_step_kernel<<<grid_for(n), kThreads, 0, s>>>(step, p, g, buf, n);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void weight_norm(const WeightNormTensor* tensors, int64_t count, cudaStream_t s) {
  WeightNormForwardList list;
  int64_t most = 0;
  for (int64_t t = 0; t < count; ++t) {
    const WeightNormTensor& a = tensors[t];
    list.t[t] = {a.v, a.g, a.w, a.rows, a.cols};
    most = std::max(most, a.rows);
  }
  if (count <= 0 || most <= 0) return;
  weight_norm_kernel<<<dim3(grid_for(most), static_cast<unsigned>(count)), kThreads, 0, s>>>(list);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void weight_norm_backward(const WeightNormTensor* tensors, int64_t count, cudaStream_t s) {
  WeightNormBackwardList list;
  int64_t most = 0;
  for (int64_t t = 0; t < count; ++t) {
    const WeightNormTensor& a = tensors[t];
    list.t[t] = {a.v, a.g, a.dw, a.dv, a.dg, a.rows, a.cols};
    most = std::max(most, a.rows);
  }
  if (count <= 0 || most <= 0) return;
  weight_norm_backward_kernel<<<dim3(grid_for(most), static_cast<unsigned>(count)), kThreads, 0, s>>>(list);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void unit_sums(const UnitSumBlock* blocks, int64_t count, cudaStream_t s) {
  UnitSumList list;
  int64_t most = 0;
  for (int64_t t = 0; t < count; ++t) {
    list.b[t] = blocks[t];
    most = std::max(most, blocks[t].n);
  }
  if (count <= 0 || most <= 0) return;
  unit_sums_kernel<<<dim3(grid_for(most), static_cast<unsigned>(count)), kThreads, 0, s>>>(list);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void adamw_step(const AdamWStep& step, const AdamWTensor* tensors, int64_t count, cudaStream_t s) {
  AdamWList list;
  int64_t most = 0;
  for (int64_t t = 0; t < count; ++t) {
    list.t[t] = tensors[t];
    most = std::max(most, tensors[t].n);
  }
  if (count <= 0 || most <= 0) return;
  dim3 grid(grid_for(most), static_cast<unsigned>(count));
  adamw_step_kernel<<<grid, kThreads, 0, s>>>(step, list);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void clip_scale(float* const* xs, const int64_t* ns, int64_t count, const double* total_sq, float max_norm,
                cudaStream_t s) {
  ScaleList list;
  int64_t most = 0;
  for (int64_t t = 0; t < count; ++t) {
    list.x[t] = xs[t];
    list.n[t] = ns[t];
    most = std::max(most, ns[t]);
  }
  if (count <= 0 || most <= 0) return;
  dim3 grid(grid_for(most), static_cast<unsigned>(count));
  clip_scale_kernel<<<grid, kThreads, 0, s>>>(list, total_sq, max_norm);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void clip_norm(const double* total_sq, float* norm, cudaStream_t s) {
  clip_norm_kernel<<<1, 1, 0, s>>>(total_sq, norm);
  VQDDP_CUDA_CHECK_LAUNCH();
}

}  // namespace vqddp::cuda
