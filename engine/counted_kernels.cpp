#include "engine/counted_kernels.h"

#include "engine/device_counters.h"

namespace vqddp {

namespace {

// One launch of `kernel` when the call has work (`n` elements or rows), as
// on a GPU; `sizes` are what the capture check compares.
void launch_if(int64_t n, const char* kernel, std::initializer_list<int64_t> sizes) {
  if (n > 0) count_launch(kernel, sizes);
}

void count_multi_tensor(const char* kernel, int64_t count) {
  for (int64_t l = 0; l < multi_tensor_launches(count); ++l) count_launch(kernel, {count});
}

int64_t plan_elements(const StridedCopyPlan& p) {
  int64_t n = 1;
  for (int i = 0; i < p.ndim; ++i) n *= p.shape[i];
  return n;
}

}  // namespace

void CountedKernels::copy(void* dst, bool dst_host, const void* src, bool src_host, size_t bytes) {
  if (bytes > 0 && !dst_host && !src_host) {
    count_launch("copy", {static_cast<int64_t>(bytes)});
    count_layout_bytes(static_cast<int64_t>(bytes));
  }
  k_.copy(dst, dst_host, src, src_host, bytes);
}

void CountedKernels::fill(void* p, DType dtype, int64_t n, double value) {
  launch_if(n, "fill", {n, static_cast<int64_t>(dtype)});
  k_.fill(p, dtype, n, value);
}

void CountedKernels::binary(BinaryOp op, const float* a, const float* b, float* out, const BroadcastPlan& plan) {
  int64_t n = 1;
  for (int i = 0; i < plan.ndim; ++i) n *= plan.shape[i];
  launch_if(n, "binary", {n, static_cast<int64_t>(op), plan.ndim});
  k_.binary(op, a, b, out, plan);
}

void CountedKernels::unary(const UnaryFn& fn, const float* x, float* out, int64_t n) {
  launch_if(n, "unary", {n, static_cast<int64_t>(fn.op)});
  k_.unary(fn, x, out, n);
}

void CountedKernels::unary_backward(const UnaryFn& fn, const float* x, const float* y, const float* g, float* out,
                                    int64_t n) {
  launch_if(n, "unary_backward", {n, static_cast<int64_t>(fn.op)});
  k_.unary_backward(fn, x, y, g, out, n);
}

void CountedKernels::cast_f64_to_f32(const double* src, float* dst, int64_t n) {
  launch_if(n, "cast_f64_to_f32", {n});
  k_.cast_f64_to_f32(src, dst, n);
}

void CountedKernels::reduce_sum(const float* x, float* out, const ReducePlan& plan) {
  count_launch("reduce_sum", {plan.nkeep, plan.nred, plan.nkeep ? plan.keep_size[0] : 0, plan.red_size[0]});  // an empty reduction still writes its zeros
  k_.reduce_sum(x, out, plan);
}

void CountedKernels::arg_best(const float* x, int64_t* out, float* values, int64_t rows, int64_t k, bool max) {
  launch_if(rows, "arg_best", {rows, k, max});
  k_.arg_best(x, out, values, rows, k, max);
}

int64_t CountedKernels::first_nonfinite(const float* x, int64_t n) {
  count_launch("first_nonfinite", {n});  // its result is read back: a launch and a transfer
  return k_.first_nonfinite(x, n);
}

void CountedKernels::max_abs_finite(const float* x, int64_t n, double* acc) {
  launch_if(n, "max_abs_finite", {n});
  k_.max_abs_finite(x, n, acc);
}

void CountedKernels::min_max_i64(const int64_t* x, int64_t n, int64_t* lo, int64_t* hi) {
  count_launch("min_max_i64", {n});
  k_.min_max_i64(x, n, lo, hi);
}

void CountedKernels::gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  launch_if(m * n, "gemm", {m, n, k, ta * 2 + tb});
  k_.gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void CountedKernels::gemm_fixed(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                                const float* b, int64_t ldb, float* c, int64_t ldc, const GemmBatch& batch) {
  launch_if(m * n * batch.count, "gemm_fixed", {m, n, k, batch.count * 4 + ta * 2 + tb});
  k_.gemm_fixed(ta, tb, m, n, k, a, lda, b, ldb, c, ldc, batch);
}

void CountedKernels::strided_copy(const void* src, void* dst, size_t elem_size, const StridedCopyPlan& plan) {
  int64_t n = plan_elements(plan);
  launch_if(n, "strided_copy", {n, static_cast<int64_t>(elem_size), plan.ndim});
  count_layout_bytes(n * static_cast<int64_t>(elem_size));
  k_.strided_copy(src, dst, elem_size, plan);
}

void CountedKernels::copy_blocks(const CopyBlock* blocks, int64_t count, size_t elem_size) {
  int64_t bytes = 0, copied = 0;  // written; copied (zero fills are not layout)
  for (int64_t b = 0; b < count; ++b) {
    const int64_t n = blocks[b].rows * blocks[b].width * static_cast<int64_t>(elem_size);
    bytes += n;
    if (blocks[b].src) copied += n;
  }
  if (bytes > 0) count_multi_tensor("copy_blocks", count);
  count_layout_bytes(copied);
  k_.copy_blocks(blocks, count, elem_size);
}

void CountedKernels::unit_sums(const UnitSumBlock* blocks, int64_t count) {
  if (count > 0) count_multi_tensor("unit_sums", count);
  k_.unit_sums(blocks, count);
}

void CountedKernels::gather_rows(const void* x, const int64_t* index, int64_t m, size_t row_bytes, void* out) {
  launch_if(m, "gather_rows", {m, static_cast<int64_t>(row_bytes)});
  k_.gather_rows(x, index, m, row_bytes, out);
}

void CountedKernels::index_add_rows(const float* src, const int64_t* index, int64_t n, int64_t d, int64_t k,
                                    double* counts, double* sums, const double* grid_max) {
  launch_if(k, "index_add_rows", {n, d, k, grid_max != nullptr});
  k_.index_add_rows(src, index, n, d, k, counts, sums, grid_max);
}

void CountedKernels::im2col(const float* x, float* cols, const ConvPlan& plan) {
  count_launch("im2col", {plan.n, plan.c, plan.oh, plan.ow});
  k_.im2col(x, cols, plan);
}

void CountedKernels::col2im(const float* cols, float* x, const ConvPlan& plan) {
  count_launch("col2im", {plan.n, plan.c, plan.oh, plan.ow});
  k_.col2im(cols, x, plan);
}

void CountedKernels::conv_fixed(const float* x, const float* w, const float* bias, int64_t cout, float* y,
                                const ConvPlan& plan) {
  count_launch("conv_fixed", {plan.n, plan.c, cout, plan.oh * plan.ow, bias != nullptr});
  k_.conv_fixed(x, w, bias, cout, y, plan);
}

void CountedKernels::conv_fixed_data(const float* g, const float* w, const float* bias, int64_t cout, float* dx,
                                     const ConvPlan& plan) {
  count_launch("conv_fixed_data", {plan.n, plan.c, cout, plan.h * plan.w, bias != nullptr});
  k_.conv_fixed_data(g, w, bias, cout, dx, plan);
}

void CountedKernels::conv_fixed_weight(const float* x, const float* g, int64_t cout, float* partials,
                                       float* bias_partials, const ConvPlan& plan) {
  count_launch("conv_fixed_weight", {plan.n, plan.c, cout, plan.oh * plan.ow});
  k_.conv_fixed_weight(x, g, cout, partials, bias_partials, plan);
}

void CountedKernels::index_copy_rows(const float* src, const int64_t* index, int64_t m, int64_t d, float scale,
                                     float* dst) {
  launch_if(m, "index_copy_rows", {m, d});
  k_.index_copy_rows(src, index, m, d, scale, dst);
}

void CountedKernels::sgd_step(const SgdStep& step, float* p, const float* g, float* buf, int64_t n) {
  launch_if(n, "sgd_step", {n});
  k_.sgd_step(step, p, g, buf, n);
}

// Multi-tensor calls: one launch per kMultiTensors tensors (device.h).
void CountedKernels::adamw_step(const AdamWStep& step, const AdamWTensor* tensors, int64_t count) {
  count_multi_tensor("adamw_step", count);
  k_.adamw_step(step, tensors, count);
}

void CountedKernels::sum_squares(const float* const* xs, const int64_t* ns, int64_t count, double* acc) {
  count_multi_tensor("sum_squares", count);
  k_.sum_squares(xs, ns, count, acc);
}

void CountedKernels::clip_scale(float* const* xs, const int64_t* ns, int64_t count, const double* total_sq,
                                float max_norm) {
  count_multi_tensor("clip_scale", count);
  k_.clip_scale(xs, ns, count, total_sq, max_norm);
}

void CountedKernels::clip_norm(const double* total_sq, float* norm) {
  count_launch("clip_norm", {});
  k_.clip_norm(total_sq, norm);
}

void CountedKernels::weight_norm(const WeightNormTensor* tensors, int64_t count) {
  if (count > 0) count_multi_tensor("weight_norm", count);
  k_.weight_norm(tensors, count);
}

void CountedKernels::weight_norm_backward(const WeightNormTensor* tensors, int64_t count) {
  if (count > 0) count_multi_tensor("weight_norm_backward", count);
  k_.weight_norm_backward(tensors, count);
}

void CountedKernels::mse(const float* a, const float* b, int64_t n, float* out) {
  count_launch("mse", {n});
  k_.mse(a, b, n, out);
}

void CountedKernels::index_add_rows_f32(const float* src, const int64_t* index, int64_t n, int64_t d, int64_t k,
                                        float* sums) {
  launch_if(k, "index_add_rows_f32", {n, d, k});
  k_.index_add_rows_f32(src, index, n, d, k, sums);
}

}  // namespace vqddp
