// Reductions (sum, mean, argmin, argmax) and the mean-squared-error loss.
//
// A reduction along `dim` views the input as [outer, n, inner] and
// accumulates each output in double in ascending order: deterministic, and
// accurate enough that W-rank and 1-rank sums agree to float rounding.
#include "engine/autograd.h"
#include "engine/device_plans.h"
#include "engine/kernel_math.h"
#include "engine/ops.h"

namespace vqddp {

namespace {

struct DimSplit {
  int64_t outer = 1, n = 1, inner = 1;
  Shape reduced;  // shape after the reduction
};

DimSplit split_at(const Tensor& x, int64_t dim, bool keepdim, const char* op) {
  VQDDP_CHECK(x.dtype() == DType::f32, "{}: expected a float32 tensor, got {}", op, x.desc());
  int64_t r = x.dim();
  VQDDP_CHECK(dim >= -r && dim < r, "{}: dim {} out of range for {}", op, dim, x.desc());
  if (dim < 0) dim += r;
  DimSplit s;
  for (int64_t d = 0; d < r; ++d) {
    int64_t size = x.shape()[d];
    if (d < dim) s.outer *= size;
    if (d == dim) s.n = size;
    if (d > dim) s.inner *= size;
    if (d != dim || keepdim) s.reduced.push_back(d == dim ? 1 : size);
  }
  return s;
}

// Gradient of a (scaled) sum: the output gradient repeated along the
// reduced dimension, divided by `divisor` in double.
Tensor expand_grad(const Tensor& g, const DimSplit& s, const Shape& input_shape, double divisor) {
  // g [outer, inner] read at (o, i) for every k of [outer, n, inner]
  // (stride 0 along n): a reduction plan with nothing reduced.
  Tensor gx = empty(input_shape, DType::f32, g.device());
  ReducePlan p;
  p.divisor = divisor;
  p.nkeep = 3;
  int64_t sizes[3] = {s.outer, s.n, s.inner}, strides[3] = {s.inner, 0, 1};
  for (int i = 0; i < 3; ++i) {
    p.keep_size[i] = sizes[i];
    p.keep_stride[i] = strides[i];
  }
  device_of("sum backward", {&g}).reduce_sum(static_cast<const float*>(g.raw_ptr()), static_cast<float*>(gx.raw_ptr()), p);
  return gx;
}

// divisor 1 for sum, n for mean: the division happens once, in double.
Tensor reduce_sum(const Tensor& x, const DimSplit& s, double divisor, const char* op) {
  Tensor out = empty(s.reduced, DType::f32, x.device());
  device_of(op, {&x}).reduce_sum(static_cast<const float*>(x.raw_ptr()), static_cast<float*>(out.raw_ptr()),
                                 sum_dim_plan(s.outer, s.n, s.inner, divisor));
  Shape in_shape = x.shape();
  return record_op(op, out, {x}, [s, in_shape, divisor](const Tensor& g) -> std::vector<Tensor> {
    return {expand_grad(g, s, in_shape, divisor)};
  });
}

// Whole-tensor reductions reuse the along-dim code on a flat view.
DimSplit split_all(const Tensor& x, const char* op) {
  VQDDP_CHECK(x.dtype() == DType::f32, "{}: expected a float32 tensor, got {}", op, x.desc());
  DimSplit s;
  s.n = x.numel();
  return s;
}

Tensor arg_best(const Tensor& x, const char* op, bool max) {
  VQDDP_CHECK(x.dtype() == DType::f32, "{}: expected a float32 tensor, got {}", op, x.desc());
  VQDDP_CHECK(x.dim() >= 1 && x.size(-1) > 0, "{}: needs a non-empty last dimension, got {}", op, x.desc());
  int64_t k = x.size(-1), rows = x.numel() / k;
  Shape shape(x.shape().begin(), x.shape().end() - 1);
  Tensor out = empty(shape, DType::i64, x.device());
  // arg_better's order (kernel_math.h): lowest index on ties, a number
  // beats NaN, an all-NaN row gives 0.
  device_of(op, {&x}).arg_best(static_cast<const float*>(x.raw_ptr()), static_cast<int64_t*>(out.raw_ptr()), nullptr,
                               rows, k, max);
  return out;
}

}  // namespace

Tensor sum(const Tensor& x) {
  Tensor flat = reshape(x, {x.numel()});
  return reshape(reduce_sum(flat, split_all(x, "sum"), 1.0, "sum"), {});
}

Tensor mean(const Tensor& x) {
  VQDDP_CHECK(x.numel() > 0, "mean of an empty tensor {}", x.desc());
  Tensor flat = reshape(x, {x.numel()});
  return reshape(reduce_sum(flat, split_all(x, "mean"), static_cast<double>(x.numel()), "mean"), {});
}

Tensor sum(const Tensor& x, int64_t dim, bool keepdim) { return reduce_sum(x, split_at(x, dim, keepdim, "sum"), 1.0, "sum"); }

Tensor mean(const Tensor& x, int64_t dim, bool keepdim) {
  DimSplit s = split_at(x, dim, keepdim, "mean");
  VQDDP_CHECK(s.n > 0, "mean over an empty dimension of {}", x.desc());
  return reduce_sum(x, s, static_cast<double>(s.n), "mean");
}

Tensor argmin(const Tensor& x) { return arg_best(x, "argmin", false); }
Tensor argmax(const Tensor& x) { return arg_best(x, "argmax", true); }

Tensor max_last(const Tensor& x) {
  VQDDP_CHECK(x.dtype() == DType::f32, "max_last: expected a float32 tensor, got {}", x.desc());
  VQDDP_CHECK(x.dim() >= 1 && x.size(-1) > 0, "max_last: needs a non-empty last dimension, got {}", x.desc());
  int64_t k = x.size(-1), rows = x.numel() / k;
  Shape shape = x.shape();
  shape.back() = 1;
  Tensor out = empty(shape, DType::f32, x.device());
  device_of("max_last", {&x}).arg_best(static_cast<const float*>(x.raw_ptr()), nullptr,
                                       static_cast<float*>(out.raw_ptr()), rows, k, true);
  return out;
}

Tensor softmax_rows(const Tensor& logits) {
  // The row maximum is subtracted as a constant: it changes nothing
  // mathematically and keeps exp() finite.
  Tensor e = vqddp::exp(sub(logits, max_last(logits.detach())));
  return div(e, sum(e, -1, true));
}

Tensor entropy_rows(const Tensor& p) { return neg(sum(mul(p, vqddp::log(clamp(p, 1e-5f, 1.f))), -1)); }

Tensor l2_normalize_rows(const Tensor& x) {
  VQDDP_CHECK(x.dim() == 2, "l2_normalize_rows expects [N, D], got {}", x.desc());
  // Clamp the squared norm (at 1e-24 = (1e-12)^2) before the sqrt so an
  // all-zero row gets a finite gradient instead of 0 * inf.
  Tensor norm = vqddp::sqrt(clamp(sum(square(x), 1, true), 1e-24f, 3.4e38f));  // (N, 1)
  return div(x, norm);
}

int64_t first_nonfinite(const Tensor& x) {
  VQDDP_CHECK(x.dtype() == DType::f32, "first_nonfinite: expected a float32 tensor, got {}", x.desc());
  return device_of("first_nonfinite", {&x}).first_nonfinite(static_cast<const float*>(x.raw_ptr()), x.numel());
}

Tensor mse_loss(const Tensor& a, const Tensor& b) {
  VQDDP_CHECK(a.shape() == b.shape(), "mse_loss: shapes {} and {} differ", shape_str(a.shape()), shape_str(b.shape()));
  VQDDP_CHECK(a.dtype() == DType::f32 && b.dtype() == DType::f32, "mse_loss: expected float32, got {} and {}",
              a.desc(), b.desc());
  VQDDP_CHECK(a.numel() > 0, "mse_loss of empty tensors {}", a.desc());
  int64_t n = a.numel();
  // The difference and its square in double, summed in a fixed order, on
  // every device (the CPU's historical bits, which the golden files pin).
  Tensor out = empty({}, DType::f32, a.device());
  device_of("mse_loss", {&a, &b})
      .mse(static_cast<const float*>(a.raw_ptr()), static_cast<const float*>(b.raw_ptr()), n,
           static_cast<float*>(out.raw_ptr()));
  Tensor da = a.detach(), db = b.detach();
  bool need_a = a.requires_grad(), need_b = b.requires_grad();
  return record_op("mse_loss", out, {a, b}, {a, b}, [=](const Tensor& g) -> std::vector<Tensor> {
    // d/da mean((a-b)^2) = 2 (a - b) / n; the gradient for b is its negation.
    // The factor 2 g / n rounded in float, as ops on g's device: g is never
    // read back (on a GPU that would wait in every backward of every VQ loss).
    Tensor diff = mul(sub(da, db), div(mul(g, 2.f), static_cast<float>(n)));
    return {need_a ? diff : Tensor(), need_b ? neg(diff) : Tensor()};
  });
}

}  // namespace vqddp
