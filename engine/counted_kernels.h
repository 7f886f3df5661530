// Launch counting for devices other than the CPU. device_kernels() hands out
// a CountedKernels around the simulated device's table and around each
// GPU's, so `sim` and `cuda` count by one rule, in one place, and a sim run
// counts exactly what the CUDA backend would launch for the same calls:
//   launches      every kernel-table call that queues work on the device's
//                 stream (a kernel, a cuBLAS product, a device-to-device
//                 copy, a fill); calls of zero elements queue nothing on a
//                 GPU and count nothing. Copies to or from the host are
//                 counted as transfers (device_counters.h), not launches.
//   layout_bytes  bytes written by layout copies: strided copies (transpose,
//                 concat, their backwards) and device-to-device copies
//                 (contiguous copies, slice backwards).
// Work inside a CollectiveStagingScope (a communicator's own copies) counts
// as staging, not as the step's.
// It is also where a graphed step's launches, memory, uploads and reads meet
// its step graph (engine/step_graph.h), for sim and cuda alike.
// Internal header: not installed with the library (the launch-counting wrapper of the kernel tables).
#pragma once

#include "engine/device.h"
#include "engine/device_counters.h"

namespace vqddp {

class CountedKernels final : public DeviceKernels {
 public:
  // `counts_flops`: this wrapper counts each call's FLOPs (engine/kernel_flops.h),
  // for a table that does not count its own (CUDA's); the CPU's table,
  // and so the simulated device's, counts them where it computes.
  CountedKernels(DeviceKernels& inner, bool counts_flops) : k_(inner), counts_flops_(counts_flops) {}

  void* alloc(size_t bytes) override;
  void release(void* p, size_t bytes) override;
  void copy(void* dst, bool dst_host, const void* src, bool src_host, size_t bytes) override;
  void fill(void* p, DType dtype, int64_t n, double value) override;
  void synchronize() override;
  bool captures_streams() const override { return k_.captures_streams(); }
  void begin_capture() override { k_.begin_capture(); }
  void* end_capture() override { return k_.end_capture(); }
  void launch_graph(void* graph) override { k_.launch_graph(graph); }
  void destroy_graph(void* graph) override { k_.destroy_graph(graph); }

  void binary(BinaryOp op, const float* a, const float* b, float* out, const BroadcastPlan& plan) override;
  void unary(const UnaryFn& fn, const float* x, float* out, int64_t n) override;
  void unary_backward(const UnaryFn& fn, const float* x, const float* y, const float* g, float* out,
                      int64_t n) override;
  void cast_f64_to_f32(const double* src, float* dst, int64_t n) override;

  void reduce_sum(const float* x, float* out, const ReducePlan& plan) override;
  void arg_best(const float* x, int64_t* out, float* values, int64_t rows, int64_t k, bool max) override;
  int64_t first_nonfinite(const float* x, int64_t n) override;
  void min_max_i64(const int64_t* x, int64_t n, int64_t* lo, int64_t* hi) override;

  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
            const float* b, int64_t ldb, float beta, float* c, int64_t ldc) override;
  void gemm_fixed(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float* c, int64_t ldc, const GemmBatch& batch) override;

  void strided_copy(const void* src, void* dst, size_t elem_size, const StridedCopyPlan& plan) override;
  void copy_blocks(const CopyBlock* blocks, int64_t count, size_t elem_size) override;
  void unit_sums(const UnitSumBlock* blocks, int64_t count) override;
  void gather_rows(const void* x, const int64_t* index, int64_t m, size_t row_bytes, void* out) override;
  void max_abs_finite(const float* x, int64_t n, double* acc) override;
  void index_add_rows(const float* src, const int64_t* index, int64_t n, int64_t d, int64_t k, double* counts,
                      double* sums, const double* grid_max = nullptr) override;
  void im2col(const float* x, float* cols, const ConvPlan& plan) override;
  void col2im(const float* cols, float* x, const ConvPlan& plan) override;
  void conv_fixed(const float* x, const float* w, const float* bias, int64_t cout, float* y,
                  const ConvPlan& plan) override;
  void conv_fixed_data(const float* g, const float* w, const float* bias, int64_t cout, float* dx,
                       const ConvPlan& plan) override;
  void conv_fixed_weight(const float* x, const float* g, int64_t cout, float* partials, float* bias_partials,
                         const ConvPlan& plan) override;
  void index_copy_rows(const float* src, const int64_t* index, int64_t m, int64_t d, float scale,
                       float* dst) override;

  void sgd_step(const SgdStep& step, float* p, const float* g, float* buf, int64_t n) override;
  void adamw_step(const AdamWStep& step, const AdamWTensor* tensors, int64_t count) override;
  void sum_squares(const float* const* xs, const int64_t* ns, int64_t count, double* acc) override;
  void clip_scale(float* const* xs, const int64_t* ns, int64_t count, const double* total_sq, float max_norm) override;
  void clip_norm(const double* total_sq, float* norm) override;

  void weight_norm(const WeightNormTensor* tensors, int64_t count) override;
  void weight_norm_backward(const WeightNormTensor* tensors, int64_t count) override;
  void mse(const float* a, const float* b, int64_t n, float* out) override;
  void index_add_rows_f32(const float* src, const int64_t* index, int64_t n, int64_t d, int64_t k,
                          float* sums) override;

 private:
  // Issues a launch (`run`, a call of k_), or hands it to the step graph
  // of a graphed step with the signature of its arguments.
  template <class Run, class... Args>
  void issue(const char* kernel, Run&& run, const Args&... args);
  void flops(int64_t n) const {
    if (counts_flops_) count_flops(n);
  }
  DeviceKernels& k_;
  bool counts_flops_;
};

}  // namespace vqddp
