// Elementwise ops: broadcasting binary ops and unary math, with backward.
#include "engine/autograd.h"
#include "engine/device_plans.h"
#include "engine/exact_batch.h"
#include "engine/kernel_math.h"
#include "engine/ops.h"

namespace vqddp {

namespace {

void check_f32(const Tensor& t, const char* op) {
  VQDDP_CHECK(t.defined(), "{}: undefined input", op);
  VQDDP_CHECK(t.dtype() == DType::f32, "{}: expected a float32 tensor, got {}", op, t.desc());
}

template <BinaryOp Op>
Tensor binary_forward(const char* op, const Tensor& a, const Tensor& b) {
  check_f32(a, op);
  check_f32(b, op);
  Shape shape = broadcast_shape(a.shape(), b.shape());
  DeviceKernels& k = device_of(op, {&a, &b});
  Tensor out = empty(shape, DType::f32, a.device());
  k.binary(Op, static_cast<const float*>(a.raw_ptr()), static_cast<const float*>(b.raw_ptr()),
           static_cast<float*>(out.raw_ptr()), broadcast_plan(a.shape(), b.shape(), shape));
  return out;
}

// Gradients of a binary op: `ga`/`gb` build each input's gradient from the
// output gradient; only inputs that require grad are computed.
// `saved` are the operands ga/gb read values of.
template <class GA, class GB>
Tensor binary_op(const char* op, const Tensor& a, const Tensor& b, Tensor out, const std::vector<Tensor>& saved, GA ga,
                 GB gb) {
  bool need_a = a.requires_grad(), need_b = b.requires_grad();
  Shape sa = a.shape(), sb = b.shape();
  return record_op(op, std::move(out), {a, b}, saved, [=](const Tensor& g) -> std::vector<Tensor> {
    // A batch-free operand broadcast over a batched one (a bias, a scale):
    // its gradient is a sum over the batch, by units in an exact step.
    auto to = [op](size_t i, const Tensor& grad, const Shape& shape) {
      return wants_unit_partials(i) ? unit_sum_to_shape(grad, shape, op) : sum_to_shape(grad, shape);
    };
    return {need_a ? to(0, ga(g), sa) : Tensor(), need_b ? to(1, gb(g), sb) : Tensor()};
  });
}

Tensor unary_op(const char* op, const Tensor& x, UnaryFn fn) {
  check_f32(x, op);
  Tensor out = empty(x.shape(), DType::f32, x.device());
  device_of(op, {&x}).unary(fn, static_cast<const float*>(x.raw_ptr()), static_cast<float*>(out.raw_ptr()), x.numel());
  if (!any_requires_grad({x})) return out;
  // Detached copies of the handles: the node must not own its own output or
  // its input's history (only the graph edges in Node::inputs do).
  Tensor xd = x.detach(), y = out.detach();
  return record_op(op, out, {x}, {x, out}, [op, x = xd, y, fn](const Tensor& g) -> std::vector<Tensor> {
    Tensor gx = empty(x.shape(), DType::f32, x.device());
    device_of(op, {&x, &g}).unary_backward(fn, static_cast<const float*>(x.raw_ptr()),
                                           static_cast<const float*>(y.raw_ptr()), static_cast<const float*>(g.raw_ptr()),
                                           static_cast<float*>(gx.raw_ptr()), x.numel());
    return {gx};
  });
}

}  // namespace

Shape broadcast_shape(const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    VQDDP_CHECK(da == db || da == 1 || db == 1, "shapes {} and {} do not broadcast", shape_str(a), shape_str(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Tensor sum_to_shape(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  VQDDP_CHECK(broadcast_shape(shape, grad.shape()) == grad.shape(), "cannot sum a {} gradient to shape {}",
              grad.desc(), shape_str(shape));
  // Accumulated in double, like every other sum: a bias gradient over many
  // rows must not depend on float rounding more than the 1-rank/W-rank
  // comparisons tolerate.
  Tensor out = empty(shape, DType::f32, grad.device());
  device_of("sum_to_shape", {&grad})
      .reduce_sum(static_cast<const float*>(grad.raw_ptr()), static_cast<float*>(out.raw_ptr()),
                  sum_to_plan(grad.shape(), shape, 1.0));
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward<BinaryOp::add>("add", a, b);
  return binary_op(
      "add", a, b, out, {}, [](const Tensor& g) { return g; }, [](const Tensor& g) { return g; });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward<BinaryOp::sub>("sub", a, b);
  return binary_op(
      "sub", a, b, out, {}, [](const Tensor& g) { return g; }, [](const Tensor& g) { return neg(g); });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward<BinaryOp::mul>("mul", a, b);
  Tensor da = a.detach(), db = b.detach();
  return binary_op(
      "mul", a, b, out, {a, b}, [db](const Tensor& g) { return mul(g, db); }, [da](const Tensor& g) { return mul(g, da); });
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward<BinaryOp::div>("div", a, b);
  Tensor da = a.detach(), db = b.detach();
  return binary_op(
      "div", a, b, out, {a, b}, [db](const Tensor& g) { return div(g, db); },
      [da, db](const Tensor& g) { return neg(div(mul(g, da), mul(db, db))); });
}

// The scalar lives on a's device, so scalar forms work on any device; it is
// a constant, so a weight times 2 stays batch-free (exact_batch.h).
static Tensor scalar_like(const Tensor& a, float b) {
  return mark_batch_free(a.defined() ? full({}, b, DType::f32, a.device()) : scalar(b));
}
Tensor add(const Tensor& a, float b) { return add(a, scalar_like(a, b)); }
Tensor sub(const Tensor& a, float b) { return sub(a, scalar_like(a, b)); }
Tensor mul(const Tensor& a, float b) { return mul(a, scalar_like(a, b)); }
Tensor div(const Tensor& a, float b) { return div(a, scalar_like(a, b)); }
Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator*(const Tensor& a, float b) { return mul(a, b); }
Tensor operator-(const Tensor& a) { return neg(a); }

using U = UnaryFn::Op;

Tensor neg(const Tensor& x) { return unary_op("neg", x, {U::neg}); }
Tensor square(const Tensor& x) { return unary_op("square", x, {U::square}); }
Tensor sqrt(const Tensor& x) { return unary_op("sqrt", x, {U::sqrt}); }
Tensor exp(const Tensor& x) { return unary_op("exp", x, {U::exp}); }
Tensor log(const Tensor& x) { return unary_op("log", x, {U::log}); }
Tensor to_tf32(const Tensor& x) { return unary_op("to_tf32", x, {U::to_tf32}); }
Tensor to_bf16(const Tensor& x) { return unary_op("to_bf16", x, {U::to_bf16}); }
Tensor relu(const Tensor& x) { return unary_op("relu", x, {U::relu}); }
Tensor gelu(const Tensor& x) { return unary_op("gelu", x, {U::gelu}); }
Tensor tanh(const Tensor& x) { return unary_op("tanh", x, {U::tanh}); }
Tensor sigmoid(const Tensor& x) { return unary_op("sigmoid", x, {U::sigmoid}); }
Tensor elu(const Tensor& x, float alpha) { return unary_op("elu", x, {U::elu, alpha}); }
Tensor leaky_relu(const Tensor& x, float slope) { return unary_op("leaky_relu", x, {U::leaky_relu, slope}); }
Tensor silu(const Tensor& x) { return unary_op("silu", x, {U::silu}); }
Tensor abs(const Tensor& x) { return unary_op("abs", x, {U::abs}); }

Tensor round(const Tensor& x) { return unary_op("round", x, {U::round}); }
Tensor floor(const Tensor& x) { return unary_op("floor", x, {U::floor}); }
Tensor positive(const Tensor& x) { return unary_op("positive", x, {U::positive}); }
Tensor erf(const Tensor& x) { return unary_op("erf", x, {U::erf}); }
Tensor sign(const Tensor& x) { return unary_op("sign", x, {U::sign}); }
Tensor atan(const Tensor& x) { return unary_op("atan", x, {U::atan}); }
Tensor tan(const Tensor& x) { return unary_op("tan", x, {U::tan}); }

Tensor clamp(const Tensor& x, float low, float high) {
  VQDDP_CHECK(low <= high, "clamp: low {} > high {}", low, high);
  return unary_op("clamp", x, {U::clamp, low, high});
}

}  // namespace vqddp
