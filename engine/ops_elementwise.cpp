// Elementwise ops: broadcasting binary ops and unary math, with backward.
#include <cmath>

#include "engine/autograd.h"
#include "engine/device_plans.h"
#include "engine/kernel_math.h"
#include "engine/ops.h"

namespace vqddp {

namespace {

void check_f32(const Tensor& t, const char* op) {
  VQDDP_CHECK(t.defined(), "{}: undefined input", op);
  VQDDP_CHECK(t.dtype() == DType::f32, "{}: expected a float32 tensor, got {}", op, t.desc());
}

// Walks the elements of `out` in row-major order and tracks the offset of
// the matching element of an operand broadcast to `out` (stride 0 along the
// dimensions it is repeated in).
class BroadcastIndex {
 public:
  BroadcastIndex(const Shape& operand, const Shape& out) : out_(out), stride_(out.size(), 0), count_(out.size(), 0) {
    int64_t s = 1;
    size_t shift = out.size() - operand.size();
    for (size_t i = operand.size(); i-- > 0;) {
      if (operand[i] != 1) stride_[i + shift] = s;
      s *= operand[i];
    }
  }
  int64_t offset() const { return offset_; }
  void next() {
    for (size_t d = out_.size(); d-- > 0;) {
      offset_ += stride_[d];
      if (++count_[d] < out_[d]) return;
      offset_ -= stride_[d] * out_[d];
      count_[d] = 0;
    }
  }

 private:
  const Shape& out_;
  std::vector<int64_t> stride_, count_;
  int64_t offset_ = 0;
};

template <BinaryOp Op>
Tensor binary_forward(const char* op, const Tensor& a, const Tensor& b) {
  check_f32(a, op);
  check_f32(b, op);
  Shape shape = broadcast_shape(a.shape(), b.shape());
  if (DeviceKernels* k = device_of(op, {&a, &b})) {
    Tensor out = empty(shape, DType::f32, a.device());
    k->binary(Op, static_cast<const float*>(a.raw_ptr()), static_cast<const float*>(b.raw_ptr()),
              static_cast<float*>(out.raw_ptr()), broadcast_plan(a.shape(), b.shape(), shape));
    return out;
  }
  auto f = [](float x, float y) { return apply_binary(Op, x, y); };  // Op is a constant: inlined per op
  Tensor out = empty(shape);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* po = out.data<float>();
  int64_t n = out.numel(), na = a.numel(), nb = b.numel();
  if (na == n && nb == n) {
    for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i], pb[i]);
  } else if (na == n && nb == 1) {
    for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i], pb[0]);
  } else if (na == 1 && nb == n) {
    for (int64_t i = 0; i < n; ++i) po[i] = f(pa[0], pb[i]);
  } else if (na == n && nb > 0 && std::equal(b.shape().begin(), b.shape().end(), shape.end() - b.dim())) {
    // Trailing-row broadcast ([N, D] op [D]): the hot case of Linear's bias.
    for (int64_t i = 0; i < n; i += nb)
      for (int64_t j = 0; j < nb; ++j) po[i + j] = f(pa[i + j], pb[j]);
  } else {
    BroadcastIndex ia(a.shape(), shape), ib(b.shape(), shape);
    for (int64_t i = 0; i < n; ++i, ia.next(), ib.next()) po[i] = f(pa[ia.offset()], pb[ib.offset()]);
  }
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
    return {need_a ? sum_to_shape(ga(g), sa) : Tensor(), need_b ? sum_to_shape(gb(g), sb) : Tensor()};
  });
}

Tensor unary_op(const char* op, const Tensor& x, UnaryFn fn) {
  check_f32(x, op);
  DeviceKernels* k = device_of(op, {&x});
  Tensor out = empty(x.shape(), DType::f32, x.device());
  if (k) {
    k->unary(fn, static_cast<const float*>(x.raw_ptr()), static_cast<float*>(out.raw_ptr()), x.numel());
  } else {
    const float* px = x.data<float>();
    float* po = out.data<float>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) po[i] = fn.f(px[i]);
  }
  if (!any_requires_grad({x})) return out;
  // Detached copies of the handles: the node must not own its own output or
  // its input's history (only the graph edges in Node::inputs do).
  Tensor xd = x.detach(), y = out.detach();
  return record_op(op, out, {x}, {x, out}, [x = xd, y, fn, k](const Tensor& g) -> std::vector<Tensor> {
    Tensor gx = empty(x.shape(), DType::f32, x.device());
    if (k) {
      k->unary_backward(fn, static_cast<const float*>(x.raw_ptr()), static_cast<const float*>(y.raw_ptr()),
                        static_cast<const float*>(g.raw_ptr()), static_cast<float*>(gx.raw_ptr()), x.numel());
      return {gx};
    }
    const float *px = x.data<float>(), *py = y.data<float>(), *pg = g.data<float>();
    float* pgx = gx.data<float>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) pgx[i] = pg[i] * fn.df(px[i], py[i]);
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
  if (DeviceKernels* k = device_of("sum_to_shape", {&grad})) {
    Tensor out = empty(shape, DType::f32, grad.device());
    k->reduce_sum(static_cast<const float*>(grad.raw_ptr()), static_cast<float*>(out.raw_ptr()),
                  sum_to_plan(grad.shape(), shape, 1.0));
    return out;
  }
  // Accumulate in double, like every other sum: a bias gradient over many
  // rows must not depend on float rounding more than the 1-rank/W-rank
  // comparisons tolerate.
  std::vector<double> acc(shape_numel(shape), 0.0);
  const float* pg = grad.data<float>();
  BroadcastIndex io(shape, grad.shape());
  for (int64_t i = 0, n = grad.numel(); i < n; ++i, io.next()) acc[io.offset()] += pg[i];
  Tensor out = empty(shape);
  float* po = out.data<float>();
  for (size_t i = 0; i < acc.size(); ++i) po[i] = static_cast<float>(acc[i]);
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

// The scalar lives on a's device, so scalar forms work on any device.
static Tensor scalar_like(const Tensor& a, float b) {
  return a.defined() ? full({}, b, DType::f32, a.device()) : scalar(b);
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
Tensor relu(const Tensor& x) { return unary_op("relu", x, {U::relu}); }
Tensor gelu(const Tensor& x) { return unary_op("gelu", x, {U::gelu}); }
Tensor tanh(const Tensor& x) { return unary_op("tanh", x, {U::tanh}); }
Tensor sigmoid(const Tensor& x) { return unary_op("sigmoid", x, {U::sigmoid}); }

Tensor clamp(const Tensor& x, float low, float high) {
  VQDDP_CHECK(low <= high, "clamp: low {} > high {}", low, high);
  return unary_op("clamp", x, {U::clamp, low, high});
}

}  // namespace vqddp
