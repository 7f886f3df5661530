// Devices: where a tensor lives (Device, parse_device), and their backends,
// the primitive kernels the engine's ops need, on every device: the CPU (engine/cpu/cpu_kernels.h, the reference), a GPU
// (engine/cuda/) and the simulated device (engine/sim/).
//
// The ops in ops.h keep one definition each (checks, shapes, autograd) and
// call into a DeviceKernels for all of the arithmetic, so no device's path
// can disagree with another's about semantics. Pointers passed here are
// device pointers of the backend, except where a flag says host.
//
// Streams: every thread has its own stream on each device (created on first
// use), so W rank threads on one GPU run their kernels concurrently and in
// order per rank. All work is asynchronous on that stream; calls that
// return a value to the host (copies to host, first_nonfinite,
// min_max_i64) wait for it, and are counted (engine/device_counters.h). Memory comes from a caching allocator: freed blocks go back to a
// pool and are reused by the same stream only, so a block is never handed
// to another rank's stream while a kernel of the first may still use it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>

#include "engine/core/dtype.h"
#include "engine/conv_plan.h"
#include "engine/kernel_math.h"

namespace vqddp {

// Where a tensor's memory lives. `sim` is the simulated device: memory the
// host may not touch (Tensor::data throws, as for a GPU), arithmetic by the
// CPU's kernels (so the CPU's bits), and every transfer and wait counted
// (engine/device_counters.h). It runs every device path of vq/ and train/
// on machines without a GPU, and tests that a step never waits on the host.
struct Device {
  enum class Kind : uint8_t { cpu, cuda, sim };
  Kind kind = Kind::cpu;
  int index = 0;  // GPU ordinal for cuda, simulated device number for sim; 0 for cpu

  static Device cpu() { return {}; }
  static Device cuda(int index) { return {Kind::cuda, index}; }
  static Device sim(int index = 0) { return {Kind::sim, index}; }
  bool is_cpu() const { return kind == Kind::cpu; }
  bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu", "cuda:0", "sim:0"
};

// "cpu", "cuda", "cuda:N", "sim", "sim:N" -> Device; throws naming `what`
// (a flag or config key) and the text otherwise.
Device parse_device(const std::string& text, const std::string& what);

constexpr int kMaxDims = 8;

// A dense output of `shape` and, for each operand, the stride of each
// output dimension in that operand (0 where it is broadcast).
struct BroadcastPlan {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride_a[kMaxDims] = {};
  int64_t stride_b[kMaxDims] = {};

  // Every field, once (the launch signature's, engine/step_graph.h): the
  // structured binding names every member, so a member added and not
  // listed here does not compile. Arrays as the part in use.
  auto fields() const {
    const auto& [nd, sh, sa, sb] = *this;
    return std::tuple(nd, std::span(sh, nd), std::span(sa, nd), std::span(sb, nd));
  }
};

// Sum reduction: output element o (row-major over keep_size) is
//   sum over the reduced multi-index r of in[keep offset(o) + red offset(r)]
// accumulated in double in a FIXED order (the same tree every run), then
// divided by `divisor` and rounded once to float.
struct ReducePlan {
  int nkeep = 0, nred = 0;
  int64_t keep_size[kMaxDims] = {}, keep_stride[kMaxDims] = {};
  int64_t red_size[kMaxDims] = {}, red_stride[kMaxDims] = {};
  double divisor = 1.0;

  auto fields() const {  // as BroadcastPlan's
    const auto& [nk, nr, ks, kst, rs, rst, div] = *this;
    return std::tuple(nk, nr, std::span(ks, nk), std::span(kst, nk), std::span(rs, nr), std::span(rst, nr), div);
  }
};

// Copy of a strided source into a strided destination, element by element
// over `shape` (row-major). Transpose and concat are both this.
struct StridedCopyPlan {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t src_stride[kMaxDims] = {};
  int64_t dst_stride[kMaxDims] = {};

  auto fields() const {  // as BroadcastPlan's
    const auto& [nd, sh, ss, ds] = *this;
    return std::tuple(nd, std::span(sh, nd), std::span(ss, nd), std::span(ds, nd));
  }
};

// A batch of equal-shaped products for gemm_fixed: product i reads
// a + i * stride_a and b + i * stride_b and writes c + i * stride_c (floats).
// One launch for the whole batch (an exact step's unit partials of a weight,
// engine/ops_matmul.cpp), each product's elements by the one-product rule.
struct GemmBatch {
  int64_t count = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;

  auto fields() const {  // as BroadcastPlan's
    const auto& [n, sa, sb, sc] = *this;
    return std::tuple(n, sa, sb, sc);
  }
};

// Multi-tensor kernels (the optimizer's step, gradient clipping) take a
// list of tensors and launch once per kMultiTensors of them: the pointers
// and sizes travel as the kernel's arguments, so nothing is uploaded.
constexpr int64_t kMultiTensors = 64;
constexpr int64_t multi_tensor_launches(int64_t count) { return (count + kMultiTensors - 1) / kMultiTensors; }

// One tensor of a multi-tensor AdamW step: parameter, gradient, moments,
// elements, and its own bias corrections (steps count per parameter).
struct AdamWTensor {
  float* p = nullptr;
  const float* g = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  int64_t n = 0;
  int64_t scalar = 0;  // where its bias corrections are in AdamWStep::scalars

  auto fields() const {  // as BroadcastPlan's
    const auto& [p_, g_, m_, v_, n_, scalar_] = *this;
    return std::tuple(p_, g_, m_, v_, n_, scalar_);
  }
};

// One block of a multi-tensor copy (concat and its backward, slice_rows'
// backward): `rows` rows of `width` elements, row r from src + r * src_row
// to dst + r * dst_row (strides in elements); with src null the rows are
// zeroed instead (a gradient's rows outside a slice).
struct CopyBlock {
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t rows = 0, width = 0, src_row = 0, dst_row = 0;

  auto fields() const {  // as BroadcastPlan's
    const auto& [s, d, r, w, sr, dr] = *this;
    return std::tuple(s, d, r, w, sr, dr);
  }
};

// One layer of a multi-tensor weight normalization (nn_conv.h): v [rows,
// cols], g [rows]; the forward writes w, the backward reads dw and writes
// dv and dg.
struct WeightNormTensor {
  const float* v = nullptr;
  const float* g = nullptr;
  float* w = nullptr;
  const float* dw = nullptr;
  float* dv = nullptr;
  float* dg = nullptr;
  int64_t rows = 0, cols = 0;

  auto fields() const {  // as BroadcastPlan's
    const auto& [v_, g_, w_, dw_, dv_, dg_, rows_, cols_] = *this;
    return std::tuple(v_, g_, w_, dw_, dv_, dg_, rows_, cols_);
  }
};

// One block of a multi-tensor unit sum (Communicator::reduce_units in a
// world of one): out[j] = the sum over u ascending of in[u * n + j], for
// j < n, in double from 0 and rounded to float once, the arithmetic of
// every transport's reduce_units (comm/rank_order.h ordered_unit_sum).
struct UnitSumBlock {
  const float* in = nullptr;
  float* out = nullptr;
  int64_t units = 0, n = 0;

  auto fields() const {  // as BroadcastPlan's
    const auto& [i, o, u, n_] = *this;
    return std::tuple(i, o, u, n_);
  }
};

class DeviceKernels {
 public:
  virtual ~DeviceKernels() = default;

  // ---- memory ---------------------------------------------------------
  virtual void* alloc(size_t bytes) = 0;
  virtual void release(void* p, size_t bytes) = 0;
  // Any direction between the host and this device; copies that touch the
  // host have completed when the call returns.
  virtual void copy(void* dst, bool dst_host, const void* src, bool src_host, size_t bytes) = 0;
  virtual void fill(void* p, DType dtype, int64_t n, double value) = 0;
  // Waits for everything this thread queued on the device.
  virtual void synchronize() = 0;
  // Stream capture for step graphs (engine/step_graph.h), where the backend
  // has it (a GPU): between begin_capture and end_capture the calling
  // thread's stream records its work instead of running it; end_capture
  // returns the graph, which launch_graph runs on that stream. Elsewhere
  // (sim) the step graph records the calls itself.
  virtual bool captures_streams() const { return false; }
  virtual void begin_capture() {}
  virtual void* end_capture() { return nullptr; }
  virtual void launch_graph(void* /*graph*/) {}
  virtual void destroy_graph(void* /*graph*/) {}

  // ---- elementwise (float32) ---------------------------------------------
  virtual void binary(BinaryOp op, const float* a, const float* b, float* out, const BroadcastPlan& plan) = 0;
  virtual void unary(const UnaryFn& fn, const float* x, float* out, int64_t n) = 0;
  // out = g * fn.df(x, y)
  virtual void unary_backward(const UnaryFn& fn, const float* x, const float* y, const float* g, float* out,
                              int64_t n) = 0;
  virtual void cast_f64_to_f32(const double* src, float* dst, int64_t n) = 0;

  // ---- reductions ------------------------------------------------------------
  virtual void reduce_sum(const float* x, float* out, const ReducePlan& plan) = 0;
  // Per row of [rows, k]: index of the best value by arg_better
  // (kernel_math.h) into `out`, and that value into `values`; either may be
  // null.
  virtual void arg_best(const float* x, int64_t* out, float* values, int64_t rows, int64_t k, bool max) = 0;
  // Position of the first NaN/Inf in x, or -1.
  virtual int64_t first_nonfinite(const float* x, int64_t n) = 0;
  // Smallest and largest value of an int64 array (n > 0), for index checks.
  virtual void min_max_i64(const int64_t* x, int64_t n, int64_t* lo, int64_t* hi) = 0;
  // *acc = max(*acc, largest |x[i]| over the finite x[i]), acc one device
  // double >= 0: the scale of the exact-sum grid (kernel_math.h
  // grid_quantum). A maximum is the same in any order, so any tree will do.
  virtual void max_abs_finite(const float* x, int64_t n, double* acc) = 0;
  // `count` UnitSumBlocks, one launch per kMultiTensors.
  virtual void unit_sums(const UnitSumBlock* blocks, int64_t count) = 0;

  // ---- linear algebra ----------------------------------------------------------
  // Row-major C[m, n] = alpha op(A) op(B) + beta C, like blas_sgemm.
  virtual void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                    const float* b, int64_t ldb, float beta, float* c, int64_t ldc) = 0;
  // C[m, n] = op(A) op(B) with fixed_gemm's rule (engine/cpu/fixed_gemm.h): each element
  // one fma chain over k ascending from +0, so the bits of the CPU's
  // fixed_gemm whatever the shape (fixed tiles, never split-K). k > 0.
  // `batch`: that many such products in one call (GemmBatch).
  virtual void gemm_fixed(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                          const float* b, int64_t ldb, float* c, int64_t ldc, const GemmBatch& batch) = 0;

  // ---- data movement ---------------------------------------------------------------
  virtual void strided_copy(const void* src, void* dst, size_t elem_size, const StridedCopyPlan& plan) = 0;
  // `count` independent 2-D copies of elements of elem_size bytes (a
  // multiple of 4), one launch per kMultiTensors.
  virtual void copy_blocks(const CopyBlock* blocks, int64_t count, size_t elem_size) = 0;
  // out[i, :] = x[index[i], :] for rows of `row_bytes`; index already checked.
  virtual void gather_rows(const void* x, const int64_t* index, int64_t m, size_t row_bytes, void* out) = 0;
  // Deterministic scatter-add of rows: for every c in [0, k),
  //   counts[c] = #{i : index[i] == c},  sums[c, :] = sum of src[i, :] over them,
  // accumulated in double in a fixed order (ascending i within fixed chunks),
  // never with floating-point atomics. Rows whose index is outside [0, k)
  // (masked rows, -1) are skipped. `counts` may be null. With `grid_max`
  // (one device double: the agreed largest |value|) each value is rounded
  // to kernel_math.h's grid first, and the sums are exact: the same bits
  // for any chunking, on any device, and after any cross-rank sum.
  virtual void index_add_rows(const float* src, const int64_t* index, int64_t n, int64_t d, int64_t k,
                              double* counts, double* sums, const double* grid_max = nullptr) = 0;
  // Convolution data movement by conv_plan.h's formulas: x [n, c, h, w] to
  // cols [n * oh * ow, c * kh * kw], and the adjoint (every x element written).
  virtual void im2col(const float* x, float* cols, const ConvPlan& plan) = 0;
  virtual void col2im(const float* cols, float* x, const ConvPlan& plan) = 0;
  // A convolution of one group and its gradients, each in one launch and
  // without the columns (conv_plan.h's conv_*_value formulas, so the bits
  // of im2col, gemm_fixed and col2im): w [cout, c kh kw];
  //   conv_fixed:        y [n, cout, oh, ow], plus bias [cout] unless null;
  //   conv_fixed_data:   dx [n, c, h, w] from g [n, cout, oh, ow], plus bias
  //                      [c] unless null (a transposed convolution's forward);
  //   conv_fixed_weight: each sample's weight gradient [n, cout, c kh kw],
  //                      and its bias gradient [n, cout] unless null.
  virtual void conv_fixed(const float* x, const float* w, const float* bias, int64_t cout, float* y,
                          const ConvPlan& plan) = 0;
  virtual void conv_fixed_data(const float* g, const float* w, const float* bias, int64_t cout, float* dx,
                               const ConvPlan& plan) = 0;
  virtual void conv_fixed_weight(const float* x, const float* g, int64_t cout, float* partials, float* bias_partials,
                                 const ConvPlan& plan) = 0;
  // dst[index[i], :] = src[i, :] * scale (index distinct, already checked).
  virtual void index_copy_rows(const float* src, const int64_t* index, int64_t m, int64_t d, float scale,
                               float* dst) = 0;

  // ---- optimizers (engine/optim.h) -------------------------------------------------
  // In place over n elements, by kernel_math.h's sgd_update / adamw_update:
  // the CPU loop's formula, rounded the same way, so the same bits.
  virtual void sgd_step(const SgdStep& step, float* p, const float* g, float* buf, int64_t n) = 0;
  // AdamW over `count` tensors, each with `step` but its own c1 and sqrt_c2
  // (read with lr from step.scalars, device memory).
  virtual void adamw_step(const AdamWStep& step, const AdamWTensor* tensors, int64_t count) = 0;
  // Gradient clipping without the host (optim.h clip_grad_norm), over the
  // `count` tensors xs[t] of ns[t] elements: *acc (one device double) += the
  // sum of their squares in double in a fixed order (the CPU's: one running
  // sum over every tensor in turn; a GPU's: each tensor's fixed tree, added
  // in turn);
  virtual void sum_squares(const float* const* xs, const int64_t* ns, int64_t count, double* acc) = 0;
  // every x[i] = scale_f64(x[i], f) with f = clip_factor(*total_sq,
  // max_norm) (kernel_math.h) where f < 1, else x unchanged;
  virtual void clip_scale(float* const* xs, const int64_t* ns, int64_t count, const double* total_sq,
                          float max_norm) = 0;
  // *norm = sqrt(*total_sq) rounded once to float.
  virtual void clip_norm(const double* total_sq, float* norm) = 0;

  // ---- weight normalization (nn_conv.h) -------------------------------------------
  // Over `count` WeightNormTensors, row by row of each v [rows, cols] (g
  // [rows]): kernel_math.h's weight_norm_rows into w, and (the backward)
  // weight_norm_rows_backward from dw into dv and dg. One launch per
  // kMultiTensors: every layer of a model in one.
  virtual void weight_norm(const WeightNormTensor* tensors, int64_t count) = 0;
  virtual void weight_norm_backward(const WeightNormTensor* tensors, int64_t count) = 0;

  // ---- losses ------------------------------------------------------------------------
  // *out = mean of (a[i] - b[i])^2 with the difference and its square in
  // double, summed in a fixed order, divided by n, rounded once. n > 0.
  virtual void mse(const float* a, const float* b, int64_t n, float* out) = 0;

  // index_select's backward: for every c in [0, k), sums[c, :] = the float32
  // sum of src[i, :] over the i with index[i] == c, added one by one in
  // ascending i from +0 (the CPU's loop, so the same bits on every device);
  // rows with an index outside [0, k) are skipped.
  virtual void index_add_rows_f32(const float* src, const int64_t* index, int64_t n, int64_t d, int64_t k,
                                  float* sums) = 0;
};

// The kernels of `device`; throws naming the device when this build has no
// CUDA or the machine has no such GPU.
DeviceKernels& device_kernels(Device device);

// Number of CUDA devices usable by this process (0 in a CPU-only build, or
// without a driver or GPU). Never throws.
int cuda_device_count();
// True when this binary was built with CUDA support.
bool cuda_built();
// Why cuda devices cannot be used in this process, or "" when they can
// (every CUDA module and library loaded; there may still be no GPU): built
// without CUDA, the CUDA runtime or a module missing. The first call loads
// the CUDA libraries (engine/cuda_module.h); nothing but this, a cuda
// device and cuda_device_count() loads them.
std::string cuda_unavailable_reason();

}  // namespace vqddp
