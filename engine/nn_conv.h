// Convolution layers (PyTorch's Conv1d, ConvTranspose1d, Conv2d,
// ConvTranspose2d) and weight normalization, on ops.h's convolutions.
#pragma once

#include "engine/nn.h"
#include "engine/ops.h"

namespace vqddp {

// Weight normalization (Salimans & Kingma 2016): g * v / |v|, |v| the norm
// of each slice v[o] over every dimension but the first; g [O]. A
// differentiable function of v and g, so both are trained.
Tensor weight_norm(const Tensor& v, const Tensor& g);

// What the four layers share: the weight as one parameter "weight", or with
// weight normalization as "weight_g" (one per slice of the first dimension,
// initialised to the norm, so the initial weight is the plain one) and
// "weight_v"; and the optional bias "bias". Weight and bias start uniform in
// +-1/sqrt(fan_in) like PyTorch's defaults, fan_in = shape[1] * kernel.
class ConvLayer : public Layer {
 public:
  // The weight the forward pass uses (g v / |v| with weight normalization).
  Tensor weight() const;
  Tensor bias;  // [C_out], undefined without bias

 protected:
  ConvLayer(const Shape& weight_shape, int64_t out_channels, Generator& gen, bool normalize, bool with_bias);

 private:
  Tensor weight_, g_, v_;
};

struct ConvLayerOptions {
  bool weight_norm = false;
  bool bias = true;
};

class Conv1d : public ConvLayer {
 public:
  Conv1d(int64_t in, int64_t out, int64_t kernel, Generator& gen, const Conv1dOptions& o = {},
         const ConvLayerOptions& layer = {});
  Tensor forward(const Tensor& x) override { return conv1d(x, weight(), bias, options); }
  Conv1dOptions options;
};

class ConvTranspose1d : public ConvLayer {
 public:
  ConvTranspose1d(int64_t in, int64_t out, int64_t kernel, Generator& gen, const Conv1dOptions& o = {},
                  const ConvLayerOptions& layer = {});
  Tensor forward(const Tensor& x) override { return conv_transpose1d(x, weight(), bias, options); }
  Conv1dOptions options;
};

class Conv2d : public ConvLayer {
 public:
  Conv2d(int64_t in, int64_t out, int64_t kernel, Generator& gen, const ConvOptions& o = {},
         const ConvLayerOptions& layer = {});
  Tensor forward(const Tensor& x) override { return conv2d(x, weight(), bias, options); }
  ConvOptions options;
};

class ConvTranspose2d : public ConvLayer {
 public:
  ConvTranspose2d(int64_t in, int64_t out, int64_t kernel, Generator& gen, const ConvOptions& o = {},
                  const ConvLayerOptions& layer = {});
  Tensor forward(const Tensor& x) override { return conv_transpose2d(x, weight(), bias, options); }
  ConvOptions options;
};

}  // namespace vqddp
