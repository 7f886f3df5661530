// Elementwise ops: broadcasting binary ops and unary math, with backward.
#include <cmath>
#include <numbers>

#include "engine/autograd.h"
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

template <class F>
Tensor binary_forward(const char* op, const Tensor& a, const Tensor& b, F f) {
  check_f32(a, op);
  check_f32(b, op);
  Shape shape = broadcast_shape(a.shape(), b.shape());
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

template <class F, class DF>
Tensor unary_op(const char* op, const Tensor& x, F f, DF df) {
  check_f32(x, op);
  Tensor out = empty(x.shape());
  const float* px = x.data<float>();
  float* po = out.data<float>();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) po[i] = f(px[i]);
  if (!any_requires_grad({x})) return out;
  // Detached copies of the handles: the node must not own its own output or
  // its input's history (only the graph edges in Node::inputs do).
  Tensor xd = x.detach(), y = out.detach();
  return record_op(op, out, {x}, {x, out}, [x = xd, y, df](const Tensor& g) -> std::vector<Tensor> {
    Tensor gx = empty(x.shape());
    const float *px = x.data<float>(), *py = y.data<float>(), *pg = g.data<float>();
    float* pgx = gx.data<float>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) pgx[i] = pg[i] * df(px[i], py[i]);
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
  Tensor out = binary_forward("add", a, b, [](float x, float y) { return x + y; });
  return binary_op(
      "add", a, b, out, {}, [](const Tensor& g) { return g; }, [](const Tensor& g) { return g; });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("sub", a, b, [](float x, float y) { return x - y; });
  return binary_op(
      "sub", a, b, out, {}, [](const Tensor& g) { return g; }, [](const Tensor& g) { return neg(g); });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("mul", a, b, [](float x, float y) { return x * y; });
  Tensor da = a.detach(), db = b.detach();
  return binary_op(
      "mul", a, b, out, {a, b}, [db](const Tensor& g) { return mul(g, db); }, [da](const Tensor& g) { return mul(g, da); });
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("div", a, b, [](float x, float y) { return x / y; });
  Tensor da = a.detach(), db = b.detach();
  return binary_op(
      "div", a, b, out, {a, b}, [db](const Tensor& g) { return div(g, db); },
      [da, db](const Tensor& g) { return neg(div(mul(g, da), mul(db, db))); });
}

Tensor add(const Tensor& a, float b) { return add(a, scalar(b)); }
Tensor sub(const Tensor& a, float b) { return sub(a, scalar(b)); }
Tensor mul(const Tensor& a, float b) { return mul(a, scalar(b)); }
Tensor div(const Tensor& a, float b) { return div(a, scalar(b)); }
Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator*(const Tensor& a, float b) { return mul(a, b); }
Tensor operator-(const Tensor& a) { return neg(a); }

Tensor neg(const Tensor& x) {
  return unary_op("neg", x, [](float v) { return -v; }, [](float, float) { return -1.f; });
}

Tensor square(const Tensor& x) {
  return unary_op("square", x, [](float v) { return v * v; }, [](float v, float) { return 2.f * v; });
}

Tensor sqrt(const Tensor& x) {
  return unary_op("sqrt", x, [](float v) { return std::sqrt(v); }, [](float, float y) { return 0.5f / y; });
}

Tensor exp(const Tensor& x) {
  return unary_op("exp", x, [](float v) { return std::exp(v); }, [](float, float y) { return y; });
}

Tensor log(const Tensor& x) {
  return unary_op("log", x, [](float v) { return std::log(v); }, [](float v, float) { return 1.f / v; });
}

Tensor relu(const Tensor& x) {
  return unary_op("relu", x, [](float v) { return v > 0.f ? v : 0.f; }, [](float v, float) { return v > 0.f ? 1.f : 0.f; });
}

Tensor gelu(const Tensor& x) {
  constexpr double kInvSqrt2 = 0.70710678118654752440;
  constexpr double kInvSqrt2Pi = 0.39894228040143267794;
  return unary_op(
      "gelu", x, [](float v) { return static_cast<float>(0.5 * v * (1.0 + std::erf(v * kInvSqrt2))); },
      [](float v, float) {
        double cdf = 0.5 * (1.0 + std::erf(v * kInvSqrt2));
        double pdf = kInvSqrt2Pi * std::exp(-0.5 * double(v) * v);
        return static_cast<float>(cdf + v * pdf);
      });
}

Tensor tanh(const Tensor& x) {
  return unary_op("tanh", x, [](float v) { return std::tanh(v); }, [](float, float y) { return 1.f - y * y; });
}

Tensor sigmoid(const Tensor& x) {
  return unary_op(
      "sigmoid", x, [](float v) { return 1.f / (1.f + std::exp(-v)); }, [](float, float y) { return y * (1.f - y); });
}

Tensor clamp(const Tensor& x, float low, float high) {
  VQDDP_CHECK(low <= high, "clamp: low {} > high {}", low, high);
  return unary_op(
      "clamp", x, [=](float v) { return std::min(std::max(v, low), high); },
      [=](float v, float) { return v >= low && v <= high ? 1.f : 0.f; });
}

}  // namespace vqddp
