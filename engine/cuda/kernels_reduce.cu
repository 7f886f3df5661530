// Reductions with a fixed summation order: every output is summed by the
// same threads in the same tree on every run, so results are bitwise
// reproducible (no floating-point atomics anywhere).
#include <climits>

#include "engine/cuda/cuda_check.h"
#include "engine/cuda/grid.cuh"
#include "engine/cuda/launch.h"

namespace vqddp::cuda {

namespace {

__device__ __forceinline__ int64_t plan_offset(const int64_t* size, const int64_t* stride, int n, int64_t i) {
  int64_t off = 0;
  for (int d = n - 1; d >= 0; --d) {
    off += (i % size[d]) * stride[d];
    i /= size[d];
  }
  return off;
}

// One block per output: thread t sums r = t, t + blockDim, ... in double,
// then a shared-memory tree in fixed order. Fixed, but not the ascending
// order of the CPU's sum: no cross-rank sum may come here (reduce_units
// adds units with unit_sums, engine/unit_sum.h).
__global__ void reduce_block_kernel(const float* x, float* out, int64_t outputs, int64_t reduced, ReducePlan plan) {
  __shared__ double part[kThreads];
  for (int64_t o = blockIdx.x; o < outputs; o += gridDim.x) {
    int64_t base = plan_offset(plan.keep_size, plan.keep_stride, plan.nkeep, o);
    double acc = 0.0;
    for (int64_t r = threadIdx.x; r < reduced; r += blockDim.x)
      acc += x[base + plan_offset(plan.red_size, plan.red_stride, plan.nred, r)];
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int step = kThreads / 2; step > 0; step /= 2) {
      if (threadIdx.x < step) part[threadIdx.x] += part[threadIdx.x + step];
      __syncthreads();
    }
    if (threadIdx.x == 0) out[o] = static_cast<float>(part[0] / plan.divisor);
    __syncthreads();
  }
}

// Short reductions: one thread per output, ascending order (like the CPU).
__global__ void reduce_thread_kernel(const float* x, float* out, int64_t outputs, int64_t reduced, ReducePlan plan) {
  VQDDP_GRID_LOOP(o, outputs) {
    int64_t base = plan_offset(plan.keep_size, plan.keep_stride, plan.nkeep, o);
    double acc = 0.0;
    for (int64_t r = 0; r < reduced; ++r) acc += x[base + plan_offset(plan.red_size, plan.red_stride, plan.nred, r)];
    out[o] = static_cast<float>(acc / plan.divisor);
  }
}

// One warp per row; lanes scan strided columns, then a shuffle tree. The
// arg_better order is total, so the tree's shape cannot change the winner.
__global__ void arg_best_kernel(const float* x, int64_t* out, float* values, int64_t rows, int64_t k, bool max) {
  int lane = threadIdx.x % 32;
  int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  for (int64_t r = warp; r < rows; r += warps) {
    const float* row = x + r * k;
    float bv = row[0];
    long long bi = 0;
    for (int64_t j = lane; j < k; j += 32)
      if (arg_better(row[j], j, bv, bi, max)) {
        bv = row[j];
        bi = j;
      }
    for (int off = 16; off > 0; off /= 2) {
      float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      long long oi = __shfl_xor_sync(0xffffffffu, bi, off);
      if (arg_better(ov, oi, bv, bi, max)) {
        bv = ov;
        bi = oi;
      }
    }
    if (lane == 0) {
      if (out) out[r] = bi;
      if (values) values[r] = bv;
    }
  }
}

__global__ void first_nonfinite_kernel(const float* x, int64_t n, unsigned long long* result) {
  VQDDP_GRID_LOOP(i, n) {
    if (!isfinite(x[i])) atomicMin(result, static_cast<unsigned long long>(i));  // integer min: order-free
  }
}

__global__ void min_max_init_kernel(long long* result) {
  result[0] = LLONG_MAX;
  result[1] = LLONG_MIN;
}

__global__ void min_max_kernel(const int64_t* x, int64_t n, long long* result) {
  VQDDP_GRID_LOOP(i, n) {
    atomicMin(&result[0], static_cast<long long>(x[i]));
    atomicMax(&result[1], static_cast<long long>(x[i]));
  }
}

// Non-negative doubles order as their bit patterns do, so an integer
// atomicMax on the bits is the float maximum, in any order.
__global__ void max_abs_finite_kernel(const float* x, int64_t n, unsigned long long* acc) {
  VQDDP_GRID_LOOP(i, n) {
    float v = fabsf(x[i]);
    if (isfinite(v)) atomicMax(acc, static_cast<unsigned long long>(__double_as_longlong(static_cast<double>(v))));
  }
}

// The block's kThreads values `acc` summed in one fixed tree through `part`
// (shared, kThreads doubles); the sum is in part[0] for every thread after.
__device__ __forceinline__ void block_tree_sum(double* part, double acc) {
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int step = kThreads / 2; step > 0; step /= 2) {
    if (threadIdx.x < step) part[threadIdx.x] += part[threadIdx.x + step];
    __syncthreads();
  }
}

// sum_squares, pass 1: block b sums its grid-stride share of x in double,
// then a shared-memory tree in fixed order, into partial[b].
// With y, the squares are of x[i] - y[i] (the difference in double).
__global__ void sum_squares_blocks_kernel(const float* x, const float* y, int64_t n, double* partial) {
  __shared__ double part[kThreads];
  double acc = 0.0;
  VQDDP_GRID_LOOP(i, n) {
    double v = y ? double(x[i]) - y[i] : double(x[i]);
    acc += v * v;
  }
  block_tree_sum(part, acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = part[0];
}

// Pass 2, one block: the partials in the same fixed tree, into *result.
__global__ void sum_partials_kernel(const double* partial, int64_t blocks, double* result) {
  __shared__ double part[kThreads];
  double acc = 0.0;
  for (int64_t b = threadIdx.x; b < blocks; b += blockDim.x) acc += partial[b];
  block_tree_sum(part, acc);
  if (threadIdx.x == 0) *result = part[0];
}

// sum_squares over a list of tensors (clip_grad_norm): each tensor's blocks
// and trees are its own single-tensor ones (sum_squares_blocks of its size,
// the same grid stride), so the list gives the bits of tensor after tensor.
struct SquaresList {
  const float* x[kMultiTensors];
  int64_t n[kMultiTensors];
  int64_t blocks[kMultiTensors];
  int64_t at[kMultiTensors];  // tensor t's first partial in the scratch
  int64_t count;
};

// Pass 1: block (b, t) is block b of tensor t's sum_squares_blocks_kernel.
__global__ void sum_squares_list_kernel(SquaresList list, double* partial) {
  const int64_t t = blockIdx.y, blocks = list.blocks[t];
  if (static_cast<int64_t>(blockIdx.x) >= blocks) return;  // the whole block: no barrier skipped
  __shared__ double part[kThreads];
  const float* x = list.x[t];
  double acc = 0.0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < list.n[t];
       i += static_cast<int64_t>(blockDim.x) * blocks) {
    double v = x[i];
    acc += v * v;
  }
  block_tree_sum(part, acc);
  if (threadIdx.x == 0) partial[list.at[t] + blockIdx.x] = part[0];
}

// Pass 2, one block: tensor after tensor, its partials in sum_partials_kernel's
// tree, added to *acc in turn.
__global__ void sum_partials_list_kernel(SquaresList list, const double* partial, double* acc) {
  __shared__ double part[kThreads];
  for (int64_t t = 0; t < list.count; ++t) {
    double a = 0.0;
    for (int64_t b = threadIdx.x; b < list.blocks[t]; b += blockDim.x) a += partial[list.at[t] + b];
    block_tree_sum(part, a);
    if (threadIdx.x == 0) *acc += part[0];
    __syncthreads();
  }
}

__global__ void mean_kernel(const double* sum, int64_t n, float* out) { *out = static_cast<float>(*sum / n); }

// Blocks of sum_squares' first pass: a function of n alone, so the
// summation tree (and the result's bits) is the same on every run.
int64_t sum_squares_blocks(int64_t n) {
  constexpr int64_t kMaxBlocks = 1024;
  int64_t blocks = grid_for(n);
  return blocks < 1 ? 1 : blocks < kMaxBlocks ? blocks : kMaxBlocks;
}

}  // namespace

int64_t sum_squares_scratch(int64_t n) { return 1 + sum_squares_blocks(n); }

int64_t sum_squares_scratch(const int64_t* ns, int64_t count) {
  int64_t total = 0;
  for (int64_t t = 0; t < count; ++t) total += sum_squares_blocks(ns[t]);
  return total > 0 ? total : 1;
}

namespace {

// scratch[0] = the sum of (x[i] - y[i])^2 (of x[i]^2 without y), two passes
// of fixed trees.
void sum_squares_to(const float* x, const float* y, int64_t n, double* scratch, cudaStream_t s) {
  if (n <= 0) {
    VQDDP_CUDA_CHECK(cudaMemsetAsync(scratch, 0, sizeof(double), s));  // all-zero bits are 0.0
    return;
  }
  int64_t blocks = sum_squares_blocks(n);
  sum_squares_blocks_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(x, y, n, scratch + 1);
  VQDDP_CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<1, kThreads, 0, s>>>(scratch + 1, blocks, scratch);
  VQDDP_CUDA_CHECK_LAUNCH();
}

}  // namespace

void sum_squares(const float* const* xs, const int64_t* ns, int64_t count, double* scratch, double* acc,
                 cudaStream_t s) {
  if (count <= 0) return;
  SquaresList list;
  list.count = count;
  int64_t at = 0, most = 1;
  for (int64_t t = 0; t < count; ++t) {
    list.x[t] = xs[t];
    list.n[t] = ns[t];
    list.blocks[t] = sum_squares_blocks(ns[t]);
    list.at[t] = at;
    at += list.blocks[t];
    most = most > list.blocks[t] ? most : list.blocks[t];
  }
  sum_squares_list_kernel<<<dim3(static_cast<unsigned>(most), static_cast<unsigned>(count)), kThreads, 0, s>>>(
      list, scratch);
  VQDDP_CUDA_CHECK_LAUNCH();
  sum_partials_list_kernel<<<1, kThreads, 0, s>>>(list, scratch, acc);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void mse(const float* a, const float* b, int64_t n, double* scratch, float* out, cudaStream_t s) {
  sum_squares_to(a, b, n, scratch, s);
  mean_kernel<<<1, 1, 0, s>>>(scratch, n, out);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void reduce_sum(const float* x, float* out, const ReducePlan& plan, cudaStream_t s) {
  int64_t outputs = 1, reduced = 1;
  for (int d = 0; d < plan.nkeep; ++d) outputs *= plan.keep_size[d];
  for (int d = 0; d < plan.nred; ++d) reduced *= plan.red_size[d];
  if (outputs <= 0) return;
  if (reduced <= 64) {
    reduce_thread_kernel<<<grid_for(outputs), kThreads, 0, s>>>(x, out, outputs, reduced, plan);
  } else {
    unsigned blocks = static_cast<unsigned>(outputs < 65536 ? outputs : 65536);
    reduce_block_kernel<<<blocks, kThreads, 0, s>>>(x, out, outputs, reduced, plan);
  }
  VQDDP_CUDA_CHECK_LAUNCH();
}

void arg_best(const float* x, int64_t* out, float* values, int64_t rows, int64_t k, bool max, cudaStream_t s) {
  if (rows <= 0 || k <= 0) return;
  arg_best_kernel<<<grid_for(rows * 32), kThreads, 0, s>>>(x, out, values, rows, k, max);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void first_nonfinite(const float* x, int64_t n, unsigned long long* result, cudaStream_t s) {
  VQDDP_CUDA_CHECK(cudaMemsetAsync(result, 0xff, sizeof(unsigned long long), s));
  if (n <= 0) return;
  first_nonfinite_kernel<<<grid_for(n), kThreads, 0, s>>>(x, n, result);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void max_abs_finite(const float* x, int64_t n, double* acc, cudaStream_t s) {
  if (n <= 0) return;
  max_abs_finite_kernel<<<grid_for(n), kThreads, 0, s>>>(x, n, reinterpret_cast<unsigned long long*>(acc));
  VQDDP_CUDA_CHECK_LAUNCH();
}

void min_max_i64(const int64_t* x, int64_t n, long long* result, cudaStream_t s) {
  min_max_init_kernel<<<1, 1, 0, s>>>(result);
  VQDDP_CUDA_CHECK_LAUNCH();
  if (n <= 0) return;
  min_max_kernel<<<grid_for(n), kThreads, 0, s>>>(x, n, result);
  VQDDP_CUDA_CHECK_LAUNCH();
}

}  // namespace vqddp::cuda
