#include "engine/nn_conv.h"

#include <cmath>

#include "engine/autograd.h"
#include "engine/device_plans.h"
#include "engine/error.h"

namespace vqddp {

// One op with one kernel each way (kernel_math.h's row formulas), not the
// five ops and their backwards it is made of: a step launches it per layer.
Tensor weight_norm(const Tensor& v, const Tensor& g) {
  VQDDP_CHECK(v.dim() >= 2 && g.dim() == 1 && g.size(0) == v.size(0), "weight_norm: g {} must be [{}] for v {}",
              g.desc(), v.dim() >= 1 ? v.size(0) : 0, v.desc());
  VQDDP_CHECK(v.dtype() == DType::f32 && g.dtype() == DType::f32, "weight_norm: expected float32, got {} and {}",
              v.desc(), g.desc());
  const int64_t rows = v.size(0), cols = rows > 0 ? v.numel() / rows : 0;
  Tensor w = empty(v.shape(), DType::f32, v.device());
  device_of("weight_norm", {&v, &g})
      .weight_norm(static_cast<const float*>(v.raw_ptr()), static_cast<const float*>(g.raw_ptr()), rows, cols,
                   static_cast<float*>(w.raw_ptr()));
  Tensor vd = v.detach(), gd = g.detach();
  return record_op("weight_norm", w, {v, g}, {v, g}, [vd, gd, rows, cols](const Tensor& dw) -> std::vector<Tensor> {
    Tensor dv = empty(vd.shape(), DType::f32, vd.device()), dg = empty(gd.shape(), DType::f32, gd.device());
    device_of("weight_norm backward", {&vd, &gd, &dw})
        .weight_norm_backward(static_cast<const float*>(vd.raw_ptr()), static_cast<const float*>(gd.raw_ptr()),
                              static_cast<const float*>(dw.raw_ptr()), rows, cols, static_cast<float*>(dv.raw_ptr()),
                              static_cast<float*>(dg.raw_ptr()));
    return {dv, dg};
  });
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

Tensor ConvLayer::weight() const { return weight_.defined() ? weight_ : weight_norm(v_, g_); }

Shape conv_weight_shape(int dims, bool transposed, int64_t in, int64_t out, int64_t kernel, int64_t groups) {
  VQDDP_CHECK(groups >= 1 && in % groups == 0 && out % groups == 0,
              "Conv{}{}d({}, {}): both channel counts must be divisible by groups {}", transposed ? "Transpose" : "",
              dims, in, out, groups);
  Shape shape = transposed ? Shape{in, out / groups} : Shape{out, in / groups};
  for (int d = 0; d < dims; ++d) shape.push_back(kernel);
  return shape;
}

}  // namespace vqddp
