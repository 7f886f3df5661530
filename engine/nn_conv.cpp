#include "engine/nn_conv.h"

#include <cmath>

#include "engine/autograd.h"
#include "engine/device_plans.h"
#include "engine/core/error.h"

namespace vqddp {

// One op for every layer, one multi-tensor kernel each way (kernel_math.h's
// row formulas): a step launches it once for the whole model, not once per
// layer (WeightNormBatch).
std::vector<Tensor> weight_norm_all(const std::vector<Tensor>& vs, const std::vector<Tensor>& gs) {
  VQDDP_CHECK(vs.size() == gs.size() && !vs.empty(), "weight_norm: {} directions and {} scales", vs.size(), gs.size());
  std::vector<Tensor> ws, inputs, saved;
  std::vector<WeightNormTensor> list;
  for (size_t i = 0; i < vs.size(); ++i) {
    const Tensor &v = vs[i], &g = gs[i];
    VQDDP_CHECK(v.dim() >= 2 && g.dim() == 1 && g.size(0) == v.size(0), "weight_norm: g {} must be [{}] for v {}",
                g.desc(), v.dim() >= 1 ? v.size(0) : 0, v.desc());
    VQDDP_CHECK(v.dtype() == DType::f32 && g.dtype() == DType::f32 && v.device() == vs[0].device() &&
                    g.device() == vs[0].device(),
                "weight_norm: expected float32 on {}, got {} and {}", vs[0].device().str(), v.desc(), g.desc());
    const int64_t rows = v.size(0), cols = rows > 0 ? v.numel() / rows : 0;
    ws.push_back(empty(v.shape(), DType::f32, v.device()));
    WeightNormTensor t;
    t.v = static_cast<const float*>(v.raw_ptr());
    t.g = static_cast<const float*>(g.raw_ptr());
    t.w = static_cast<float*>(ws.back().raw_ptr());
    t.rows = rows, t.cols = cols;
    list.push_back(t);
    inputs.push_back(v), inputs.push_back(g);
    saved.push_back(v.detach()), saved.push_back(g.detach());
  }
  device_of("weight_norm", {&vs[0], &gs[0]}).weight_norm(list.data(), static_cast<int64_t>(list.size()));
  record_multi_op("weight_norm", ws, inputs, saved, [saved](const std::vector<Tensor>& dws) -> std::vector<Tensor> {
    std::vector<Tensor> grads(saved.size());
    std::vector<WeightNormTensor> back;
    for (size_t i = 0; i < dws.size(); ++i) {
      if (!dws[i].defined()) continue;  // no gradient reached this layer's weight: none for its v and g
      const Tensor &v = saved[2 * i], &g = saved[2 * i + 1];
      grads[2 * i] = empty(v.shape(), DType::f32, v.device());
      grads[2 * i + 1] = empty(g.shape(), DType::f32, g.device());
      WeightNormTensor t;
      t.v = static_cast<const float*>(v.raw_ptr());
      t.g = static_cast<const float*>(g.raw_ptr());
      t.dw = static_cast<const float*>(dws[i].raw_ptr());
      t.dv = static_cast<float*>(grads[2 * i].raw_ptr());
      t.dg = static_cast<float*>(grads[2 * i + 1].raw_ptr());
      t.rows = v.size(0), t.cols = t.rows > 0 ? v.numel() / t.rows : 0;
      back.push_back(t);
    }
    if (!back.empty())
      device_of("weight_norm backward", {&saved[0]}).weight_norm_backward(back.data(), static_cast<int64_t>(back.size()));
    return grads;
  });
  return ws;
}

Tensor weight_norm(const Tensor& v, const Tensor& g) { return weight_norm_all({v}, {g})[0]; }

WeightNormBatch::WeightNormBatch(Module& root) {
  std::vector<Tensor> vs, gs;
  root.for_each_module([&](Module& m) {
    auto* layer = dynamic_cast<ConvLayer*>(&m);
    if (!layer || !layer->normalized()) return;
    layers_.push_back(layer);
    vs.push_back(layer->v_), gs.push_back(layer->g_);
  });
  if (layers_.empty()) return;
  std::vector<Tensor> ws = weight_norm_all(vs, gs);
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->batched_ = ws[i];
    ++layers_[i]->batches_;
  }
}

WeightNormBatch::~WeightNormBatch() {
  for (ConvLayer* layer : layers_)
    if (--layer->batches_ == 0) layer->batched_ = Tensor();
}

ConvLayer::ConvLayer(const Shape& shape, int64_t out_channels, Generator& gen, bool normalize, bool with_bias) {
  for (int64_t s : shape) VQDDP_CHECK(s > 0, "convolution weight {}: every size must be positive", shape_str(shape));
  int64_t fan_in = shape_numel(shape) / shape[0];
  float bound = 1.f / std::sqrt(static_cast<float>(fan_in));
  Tensor w = rand_uniform(shape, gen, -bound, bound);
  if (normalize) {
    NoGradGuard no_grad;
    Tensor norm = sqrt(sum(square(reshape(w, {shape[0], -1})), 1));
    g_ = register_parameter("weight_g", norm);
    v_ = register_parameter("weight_v", w);
  } else {
    weight_ = register_parameter("weight", w);
  }
  if (with_bias) bias = register_parameter("bias", rand_uniform({out_channels}, gen, -bound, bound));
}

Tensor ConvLayer::weight() const {
  if (weight_.defined()) return weight_;
  return batched_.defined() ? batched_ : weight_norm(v_, g_);
}

Shape conv_weight_shape(int dims, bool transposed, int64_t in, int64_t out, int64_t kernel, int64_t groups) {
  return conv_weight_shape(transposed, in, out, Shape(static_cast<size_t>(dims), kernel), groups);
}

Shape conv_weight_shape(bool transposed, int64_t in, int64_t out, const Shape& kernel, int64_t groups) {
  VQDDP_CHECK(groups >= 1 && in % groups == 0 && out % groups == 0,
              "Conv{}{}d({}, {}): both channel counts must be divisible by groups {}", transposed ? "Transpose" : "",
              kernel.size(), in, out, groups);
  Shape shape = transposed ? Shape{in, out / groups} : Shape{out, in / groups};
  shape.insert(shape.end(), kernel.begin(), kernel.end());
  return shape;
}

Tensor conv1d_stream(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv1dOptions& o,
                     StreamState& state) {
  VQDDP_CHECK(o.causal, "a non-causal Conv1d cannot stream: it pads both sides and reads ahead (model.causal)");
  VQDDP_CHECK(x.dim() == 3, "conv1d stream: a stretch must be [N, C, m], got {}", x.desc());
  const int64_t left = causal_padding(weight.size(2), o, false), span = left + o.stride;
  Tensor& pending = state.next([&] { return zeros({x.size(0), x.size(1), left}, x.dtype(), x.device()); });
  VQDDP_CHECK(pending.size(0) == x.size(0) && pending.size(1) == x.size(1),
              "conv1d stream: a stretch {} does not continue the stream's [{}, {}, ...]", x.desc(), pending.size(0),
              pending.size(1));
  Tensor all = x.size(2) == 0 ? pending : pending.size(2) == 0 ? x : concat({pending, x}, 2);
  const int64_t len = all.size(2), outs = len < span ? 0 : (len - span) / o.stride + 1;
  Tensor y = empty({x.size(0), weight.size(0), 0}, x.dtype(), x.device());
  if (outs > 0) {
    Conv1dOptions plain = o;
    plain.causal = false;
    const int64_t used = (outs - 1) * o.stride + span;
    y = conv1d(used == len ? all : pad_last(all, 0, used - len), weight, bias, plain);
  }
  pending = outs == 0 ? all : pad_last(all, -outs * o.stride, 0);
  return y;
}

Tensor conv_transpose1d_stream(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv1dOptions& o,
                               StreamState& state) {
  VQDDP_CHECK(o.causal, "a non-causal ConvTranspose1d cannot stream: it cuts both ends (model.causal)");
  VQDDP_CHECK(x.dim() == 3, "conv_transpose1d stream: a stretch must be [N, C, m], got {}", x.desc());
  const int64_t over = causal_padding(weight.size(2), o, true), cout = weight.size(1) * o.groups;
  VQDDP_CHECK(over <= o.stride,
              "a causal ConvTranspose1d streams only where a sample takes at most two frames: kernel {} dilation {} "
              "spans more than two strides of {}", weight.size(2), o.dilation, o.stride);
  Tensor& carry = state.next([&] { return zeros({x.size(0), cout, over}, x.dtype(), x.device()); });
  VQDDP_CHECK(carry.size(0) == x.size(0), "conv_transpose1d stream: a stretch {} does not continue the stream's [{}, "
              "...]", x.desc(), carry.size(0));
  const int64_t len = x.size(2) * o.stride;
  if (len == 0) return empty({x.size(0), cout, 0}, x.dtype(), x.device());
  Conv1dOptions plain = o;
  plain.causal = false;
  Tensor full = conv_transpose1d(x, weight, Tensor(), plain);  // [N, cout, len + over]: chains, no bias
  Tensor y = full;
  if (over > 0) {
    Tensor head = add(carry, pad_last(full, 0, -len));  // the two frames' chains, summed as the whole op's double sum rounds
    y = len == over ? head : concat({head, pad_last(full, -over, -over)}, 2);
    carry = pad_last(full, -len, 0);
  }
  return bias.defined() ? add(y, reshape(bias, {cout, 1})) : y;
}

}  // namespace vqddp
