#include "engine/sim/sim_kernels.h"

#include "engine/cpu/cpu_kernels.h"
#include "engine/cpu_allocator.h"
#include "engine/device_counters.h"

namespace vqddp {

namespace {

// Forwards the arithmetic to the CPU's kernels; counts what crosses between
// the host and the device, and what makes the host wait.
class SimKernels final : public DeviceKernels {
 public:
  void* alloc(size_t bytes) override { return cpu_alloc(bytes); }
  void release(void* p, size_t bytes) override { cpu_free(p, bytes); }
  void copy(void* dst, bool dst_host, const void* src, bool src_host, size_t bytes) override {
    if (bytes == 0) return;  // as on a GPU: nothing moves, nothing waits
    if (dst_host && !src_host) count_to_host(static_cast<int64_t>(bytes));
    if (!dst_host && src_host) count_to_device(static_cast<int64_t>(bytes));
    cpu_.copy(dst, true, src, true, bytes);
  }
  void fill(void* p, DType dtype, int64_t n, double value) override { cpu_.fill(p, dtype, n, value); }
  void synchronize() override { count_wait(); }

  void binary(BinaryOp op, const float* a, const float* b, float* out, const BroadcastPlan& plan) override {
    cpu_.binary(op, a, b, out, plan);
  }
  void unary(const UnaryFn& fn, const float* x, float* out, int64_t n) override { cpu_.unary(fn, x, out, n); }
  void unary_backward(const UnaryFn& fn, const float* x, const float* y, const float* g, float* out,
                      int64_t n) override {
    cpu_.unary_backward(fn, x, y, g, out, n);
  }
  void cast_f64_to_f32(const double* src, float* dst, int64_t n) override { cpu_.cast_f64_to_f32(src, dst, n); }

  void reduce_sum(const float* x, float* out, const ReducePlan& plan) override { cpu_.reduce_sum(x, out, plan); }
  void arg_best(const float* x, int64_t* out, int64_t rows, int64_t k, bool max) override {
    cpu_.arg_best(x, out, rows, k, max);
  }
  int64_t first_nonfinite(const float* x, int64_t n) override {
    count_to_host(sizeof(int64_t));
    return cpu_.first_nonfinite(x, n);
  }
  void min_max_i64(const int64_t* x, int64_t n, int64_t* lo, int64_t* hi) override {
    count_to_host(2 * sizeof(int64_t));
    cpu_.min_max_i64(x, n, lo, hi);
  }

  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
            const float* b, int64_t ldb, float beta, float* c, int64_t ldc) override {
    cpu_.gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  void gemm_fixed(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float* c, int64_t ldc) override {
    cpu_.gemm_fixed(ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
  }

  void strided_copy(const void* src, void* dst, size_t elem_size, const StridedCopyPlan& plan) override {
    cpu_.strided_copy(src, dst, elem_size, plan);
  }
  void gather_rows(const void* x, const int64_t* index, int64_t m, size_t row_bytes, void* out) override {
    cpu_.gather_rows(x, index, m, row_bytes, out);
  }
  void index_add_rows(const float* src, const int64_t* index, int64_t n, int64_t d, int64_t k, double* counts,
                      double* sums) override {
    cpu_.index_add_rows(src, index, n, d, k, counts, sums);
  }
  void im2col(const float* x, float* cols, const ConvPlan& plan) override { cpu_.im2col(x, cols, plan); }
  void col2im(const float* cols, float* x, const ConvPlan& plan) override { cpu_.col2im(cols, x, plan); }
  void index_copy_rows(const float* src, const int64_t* index, int64_t m, int64_t d, float scale,
                       float* dst) override {
    cpu_.index_copy_rows(src, index, m, d, scale, dst);
  }

  void sgd_step(const SgdStep& step, float* p, const float* g, float* buf, int64_t n) override {
    cpu_.sgd_step(step, p, g, buf, n);
  }
  void adamw_step(const AdamWStep& step, float* p, const float* g, float* m, float* v, int64_t n) override {
    cpu_.adamw_step(step, p, g, m, v, n);
  }
  void sum_squares(const float* x, int64_t n, double* acc) override { cpu_.sum_squares(x, n, acc); }
  void clip_scale(float* x, int64_t n, const double* total_sq, float max_norm) override {
    cpu_.clip_scale(x, n, total_sq, max_norm);
  }
  void clip_norm(const double* total_sq, float* norm) override { cpu_.clip_norm(total_sq, norm); }
  void mse(const float* a, const float* b, int64_t n, float* out) override { cpu_.mse(a, b, n, out); }
  void index_add_rows_f32(const float* src, const int64_t* index, int64_t n, int64_t d, int64_t k,
                          float* sums) override {
    cpu_.index_add_rows_f32(src, index, n, d, k, sums);
  }

 private:
  DeviceKernels& cpu_ = cpu_kernels();
};

}  // namespace

DeviceKernels& sim_kernels() {
  static SimKernels kernels;
  return kernels;
}

}  // namespace vqddp
