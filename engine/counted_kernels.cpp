#include "engine/counted_kernels.h"

#include <span>
#include <vector>

#include "engine/device_counters.h"
#include "engine/kernel_flops.h"
#include "engine/step_graph.h"

namespace vqddp {

namespace {

// One launch of `kernel` when the call has work (`n` elements or rows), as
// on a GPU; `sizes` are what a LaunchRecording keeps.
void launch_if(int64_t n, const char* kernel, std::initializer_list<int64_t> sizes) {
  if (n > 0) count_launch(kernel, sizes);
}

void count_multi_tensor(const char* kernel, int64_t count) {
  for (int64_t l = 0; l < multi_tensor_launches(count); ++l) count_launch(kernel, {count});
}

int64_t plan_elements(const StridedCopyPlan& p) { return kernel_flops::elements(p.shape, p.ndim); }

}  // namespace

template <class Run, class... Args>
void CountedKernels::issue(const char* kernel, Run&& run, const Args&... args) {
  issue_launch(this, kernel, std::forward<Run>(run), args...);
}

void* CountedKernels::alloc(size_t bytes) {
  if (GraphSession* g = graph_in_step_of(this)) [[unlikely]]
    return graph_alloc(*g, bytes, k_);
  return k_.alloc(bytes);
}

void CountedKernels::release(void* p, size_t bytes) {
  if (!graph_release(this, p, bytes, k_)) k_.release(p, bytes);
}

void CountedKernels::synchronize() {
  if (GraphSession* g = graph_in_step_of(this)) [[unlikely]]
    graph_refuse_read(*g, "waits for the device");
  k_.synchronize();
}

void CountedKernels::copy(void* dst, bool dst_host, const void* src, bool src_host, size_t bytes) {
  if (bytes > 0 && !dst_host && !src_host) {
    count_launch("copy", {static_cast<int64_t>(bytes)});
    count_layout_bytes(static_cast<int64_t>(bytes));
    issue("copy", [=, this] { k_.copy(dst, false, src, false, bytes); }, dst, src, bytes);
    return;
  }
  if (GraphSession* g = graph_in_step_of(this); g && bytes > 0) [[unlikely]] {
    if (dst_host && !src_host) graph_refuse_read(*g, "copies device memory to the host");
    if (!dst_host) return graph_upload(*g, dst, src, bytes, k_);
  }
  k_.copy(dst, dst_host, src, src_host, bytes);
}

void CountedKernels::fill(void* p, DType dtype, int64_t n, double value) {
  launch_if(n, "fill", {n, static_cast<int64_t>(dtype)});
  issue("fill", [=, this] { k_.fill(p, dtype, n, value); }, p, dtype, n, value);
}

void CountedKernels::binary(BinaryOp op, const float* a, const float* b, float* out, const BroadcastPlan& plan) {
  const int64_t n = kernel_flops::binary(plan);  // its elements: one FLOP each
  flops(n);
  launch_if(n, "binary", {n, static_cast<int64_t>(op), plan.ndim});
  issue("binary", [=, this] { k_.binary(op, a, b, out, plan); }, op, a, b, out, plan);
}

void CountedKernels::unary(const UnaryFn& fn, const float* x, float* out, int64_t n) {
  flops(kernel_flops::unary(n));
  launch_if(n, "unary", {n, static_cast<int64_t>(fn.op)});
  issue("unary", [=, this] { k_.unary(fn, x, out, n); }, fn, x, out, n);
}

void CountedKernels::unary_backward(const UnaryFn& fn, const float* x, const float* y, const float* g, float* out,
                                    int64_t n) {
  flops(kernel_flops::unary_backward(n));
  launch_if(n, "unary_backward", {n, static_cast<int64_t>(fn.op)});
  issue("unary_backward", [=, this] { k_.unary_backward(fn, x, y, g, out, n); }, fn, x, y, g, out, n);
}

void CountedKernels::cast_f64_to_f32(const double* src, float* dst, int64_t n) {
  launch_if(n, "cast_f64_to_f32", {n});
  issue("cast_f64_to_f32", [=, this] { k_.cast_f64_to_f32(src, dst, n); }, src, dst, n);
}

void CountedKernels::reduce_sum(const float* x, float* out, const ReducePlan& plan) {
  flops(kernel_flops::reduce_sum(plan));
  count_launch("reduce_sum", {plan.nkeep, plan.nred, plan.nkeep ? plan.keep_size[0] : 0, plan.red_size[0]});  // an empty reduction still writes its zeros
  issue("reduce_sum", [=, this] { k_.reduce_sum(x, out, plan); }, x, out, plan);
}

void CountedKernels::arg_best(const float* x, int64_t* out, float* values, int64_t rows, int64_t k, bool max) {
  launch_if(rows, "arg_best", {rows, k, max});
  issue("arg_best", [=, this] { k_.arg_best(x, out, values, rows, k, max); }, x, out, values, rows, k, max);
}

int64_t CountedKernels::first_nonfinite(const float* x, int64_t n) {
  if (GraphSession* g = graph_in_step_of(this)) [[unlikely]]
    graph_refuse_read(*g, "reads where a tensor holds its first non-finite value");
  count_launch("first_nonfinite", {n});  // its result is read back: a launch and a transfer
  return k_.first_nonfinite(x, n);
}

void CountedKernels::max_abs_finite(const float* x, int64_t n, double* acc) {
  launch_if(n, "max_abs_finite", {n});
  issue("max_abs_finite", [=, this] { k_.max_abs_finite(x, n, acc); }, x, n, acc);
}

void CountedKernels::min_max_i64(const int64_t* x, int64_t n, int64_t* lo, int64_t* hi) {
  if (GraphSession* g = graph_in_step_of(this)) [[unlikely]]
    graph_refuse_read(*g, "reads the least and greatest of an index tensor");
  count_launch("min_max_i64", {n});
  k_.min_max_i64(x, n, lo, hi);
}

void CountedKernels::gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  flops(kernel_flops::gemm(m, n, k));
  launch_if(m * n, "gemm", {m, n, k, ta * 2 + tb});
  issue("gemm", [=, this] { k_.gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); }, ta, tb, m, n, k, alpha,
        a, lda, b, ldb, beta, c, ldc);
}

void CountedKernels::gemm_fixed(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                                const float* b, int64_t ldb, float* c, int64_t ldc, const GemmBatch& batch) {
  flops(kernel_flops::gemm(m, n, k, batch.count));
  launch_if(m * n * batch.count, "gemm_fixed", {m, n, k, batch.count * 4 + ta * 2 + tb});
  issue("gemm_fixed", [=, this] { k_.gemm_fixed(ta, tb, m, n, k, a, lda, b, ldb, c, ldc, batch); }, ta, tb, m, n, k, a,
        lda, b, ldb, c, ldc, batch);
}

void CountedKernels::strided_copy(const void* src, void* dst, size_t elem_size, const StridedCopyPlan& plan) {
  int64_t n = plan_elements(plan);
  launch_if(n, "strided_copy", {n, static_cast<int64_t>(elem_size), plan.ndim});
  count_layout_bytes(n * static_cast<int64_t>(elem_size));
  issue("strided_copy", [=, this] { k_.strided_copy(src, dst, elem_size, plan); }, src, dst, elem_size, plan);
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
  std::span<const CopyBlock> list(blocks, static_cast<size_t>(count));
  issue("copy_blocks", [=, this, v = std::vector<CopyBlock>(list.begin(), list.end())] {
    k_.copy_blocks(v.data(), count, elem_size);
  }, list, elem_size);
}

void CountedKernels::unit_sums(const UnitSumBlock* blocks, int64_t count) {
  flops(kernel_flops::unit_sums(blocks, count));
  if (count > 0) count_multi_tensor("unit_sums", count);
  std::span<const UnitSumBlock> list(blocks, static_cast<size_t>(count));
  issue("unit_sums", [=, this, v = std::vector<UnitSumBlock>(list.begin(), list.end())] {
    k_.unit_sums(v.data(), count);
  }, list);
}

void CountedKernels::gather_rows(const void* x, const int64_t* index, int64_t m, size_t row_bytes, void* out) {
  launch_if(m, "gather_rows", {m, static_cast<int64_t>(row_bytes)});
  issue("gather_rows", [=, this] { k_.gather_rows(x, index, m, row_bytes, out); }, x, index, m, row_bytes, out);
}

void CountedKernels::index_add_rows(const float* src, const int64_t* index, int64_t n, int64_t d, int64_t k,
                                    double* counts, double* sums, const double* grid_max) {
  flops(kernel_flops::index_add_rows(n, d, true));
  launch_if(k, "index_add_rows", {n, d, k, grid_max != nullptr});
  issue("index_add_rows", [=, this] { k_.index_add_rows(src, index, n, d, k, counts, sums, grid_max); }, src, index,
        n, d, k, counts, sums, grid_max);
}

void CountedKernels::im2col(const float* x, float* cols, const ConvPlan& plan) {
  count_launch("im2col", {plan.n, plan.c, plan.oh, plan.ow});
  issue("im2col", [=, this] { k_.im2col(x, cols, plan); }, x, cols, plan);
}

void CountedKernels::col2im(const float* cols, float* x, const ConvPlan& plan) {
  flops(kernel_flops::col2im(plan));
  count_launch("col2im", {plan.n, plan.c, plan.oh, plan.ow});
  issue("col2im", [=, this] { k_.col2im(cols, x, plan); }, cols, x, plan);
}

void CountedKernels::conv_fixed(const float* x, const float* w, const float* bias, int64_t cout, float* y,
                                const ConvPlan& plan) {
  flops(kernel_flops::conv_fixed(plan, cout, bias != nullptr));
  count_launch("conv_fixed", {plan.n, plan.c, cout, plan.oh * plan.ow, bias != nullptr});
  issue("conv_fixed", [=, this] { k_.conv_fixed(x, w, bias, cout, y, plan); }, x, w, bias, cout, y, plan);
}

void CountedKernels::conv_fixed_data(const float* g, const float* w, const float* bias, int64_t cout, float* dx,
                                     const ConvPlan& plan) {
  flops(kernel_flops::conv_fixed(plan, cout, bias != nullptr));
  count_launch("conv_fixed_data", {plan.n, plan.c, cout, plan.h * plan.w, bias != nullptr});
  issue("conv_fixed_data", [=, this] { k_.conv_fixed_data(g, w, bias, cout, dx, plan); }, g, w, bias, cout, dx, plan);
}

void CountedKernels::conv_fixed_weight(const float* x, const float* g, int64_t cout, float* partials,
                                       float* bias_partials, const ConvPlan& plan) {
  flops(kernel_flops::conv_fixed(plan, cout, bias_partials != nullptr));
  count_launch("conv_fixed_weight", {plan.n, plan.c, cout, plan.oh * plan.ow});
  issue("conv_fixed_weight", [=, this] { k_.conv_fixed_weight(x, g, cout, partials, bias_partials, plan); }, x, g,
        cout, partials, bias_partials, plan);
}

void CountedKernels::index_copy_rows(const float* src, const int64_t* index, int64_t m, int64_t d, float scale,
                                     float* dst) {
  flops(kernel_flops::index_copy_rows(m, d));
  launch_if(m, "index_copy_rows", {m, d});
  issue("index_copy_rows", [=, this] { k_.index_copy_rows(src, index, m, d, scale, dst); }, src, index, m, d, scale,
        dst);
}

void CountedKernels::sgd_step(const SgdStep& step, float* p, const float* g, float* buf, int64_t n) {
  flops(kernel_flops::sgd(n));
  launch_if(n, "sgd_step", {n});
  issue("sgd_step", [=, this] { k_.sgd_step(step, p, g, buf, n); }, step, p, g, buf, n);
}

// Multi-tensor calls: one launch per kMultiTensors tensors (device.h).
void CountedKernels::adamw_step(const AdamWStep& step, const AdamWTensor* tensors, int64_t count) {
  flops(kernel_flops::adamw(tensors, count));
  count_multi_tensor("adamw_step", count);
  std::span<const AdamWTensor> list(tensors, static_cast<size_t>(count));
  issue("adamw_step", [=, this, v = std::vector<AdamWTensor>(list.begin(), list.end())] {
    k_.adamw_step(step, v.data(), count);
  }, step, list);
}

void CountedKernels::sum_squares(const float* const* xs, const int64_t* ns, int64_t count, double* acc) {
  flops(kernel_flops::sum_squares(ns, count));
  count_multi_tensor("sum_squares", count);
  std::span<const float* const> xl(xs, static_cast<size_t>(count));
  std::span<const int64_t> nl(ns, static_cast<size_t>(count));
  issue("sum_squares", [=, this, x = std::vector<const float*>(xl.begin(), xl.end()),
                        nv = std::vector<int64_t>(nl.begin(), nl.end())] {
    k_.sum_squares(x.data(), nv.data(), count, acc);
  }, xl, nl, acc);
}

void CountedKernels::clip_scale(float* const* xs, const int64_t* ns, int64_t count, const double* total_sq,
                                float max_norm) {
  flops(kernel_flops::clip_scale(ns, count));
  count_multi_tensor("clip_scale", count);
  std::span<float* const> xl(xs, static_cast<size_t>(count));
  std::span<const int64_t> nl(ns, static_cast<size_t>(count));
  issue("clip_scale", [=, this, x = std::vector<float*>(xl.begin(), xl.end()),
                       nv = std::vector<int64_t>(nl.begin(), nl.end())] {
    k_.clip_scale(x.data(), nv.data(), count, total_sq, max_norm);
  }, xl, nl, total_sq, max_norm);
}

void CountedKernels::clip_norm(const double* total_sq, float* norm) {
  flops(kernel_flops::kClipNorm);
  count_launch("clip_norm", {});
  issue("clip_norm", [=, this] { k_.clip_norm(total_sq, norm); }, total_sq, norm);
}

void CountedKernels::weight_norm(const WeightNormTensor* tensors, int64_t count) {
  flops(kernel_flops::weight_norm(tensors, count, false));
  if (count > 0) count_multi_tensor("weight_norm", count);
  std::span<const WeightNormTensor> list(tensors, static_cast<size_t>(count));
  issue("weight_norm", [=, this, v = std::vector<WeightNormTensor>(list.begin(), list.end())] {
    k_.weight_norm(v.data(), count);
  }, list);
}

void CountedKernels::weight_norm_backward(const WeightNormTensor* tensors, int64_t count) {
  flops(kernel_flops::weight_norm(tensors, count, true));
  if (count > 0) count_multi_tensor("weight_norm_backward", count);
  std::span<const WeightNormTensor> list(tensors, static_cast<size_t>(count));
  issue("weight_norm_backward", [=, this, v = std::vector<WeightNormTensor>(list.begin(), list.end())] {
    k_.weight_norm_backward(v.data(), count);
  }, list);
}

void CountedKernels::mse(const float* a, const float* b, int64_t n, float* out) {
  flops(kernel_flops::mse(n));
  count_launch("mse", {n});
  issue("mse", [=, this] { k_.mse(a, b, n, out); }, a, b, n, out);
}

void CountedKernels::index_add_rows_f32(const float* src, const int64_t* index, int64_t n, int64_t d, int64_t k,
                                        float* sums) {
  flops(kernel_flops::index_add_rows(n, d, false));
  launch_if(k, "index_add_rows_f32", {n, d, k});
  issue("index_add_rows_f32", [=, this] { k_.index_add_rows_f32(src, index, n, d, k, sums); }, src, index, n, d, k,
        sums);
}

}  // namespace vqddp
