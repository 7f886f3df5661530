// Convolution layers (PyTorch's Conv1d, ConvTranspose1d, Conv2d,
// ConvTranspose2d) and weight normalization, on ops.h's convolutions.
#pragma once

#include <array>

#include "engine/nn.h"
#include "engine/ops.h"

namespace vqddp {

// Weight normalization (Salimans & Kingma 2016): g * v / |v|, |v| the norm
// of each slice v[o] over every dimension but the first; g [O]. A
// differentiable function of v and g, so both are trained.
Tensor weight_norm(const Tensor& v, const Tensor& g);
// The same for many layers at once, [vs[i], gs[i]] -> w_i: one op of one
// kernel each way however many layers (each w_i the bits weight_norm gives).
std::vector<Tensor> weight_norm_all(const std::vector<Tensor>& vs, const std::vector<Tensor>& gs);

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
  bool normalized() const { return !weight_.defined(); }

 protected:
  ConvLayer(const Shape& weight_shape, int64_t out_channels, Generator& gen, bool normalize, bool with_bias);

 private:
  friend class WeightNormBatch;
  Tensor weight_, g_, v_;
  Tensor batched_;  // the newest live WeightNormBatch's weight, while one lives
  int batches_ = 0;  // how many live
};

// While it lives, every weight-normalized layer under `root` uses the
// weight one weight_norm_all computed for all of them at its construction:
// a model's forward makes one, so a step launches one weight-norm kernel
// each way instead of one per layer, with the same bits. Build it where the
// parameters will not change before the forward ends (not across an
// optimizer step). They nest, ending in any order: each computes the
// weights afresh, and the layers keep the newest until the last one ends
// (a stream keeps one for its life, train/codec_stream.h, and a forward
// beside it makes its own).
class WeightNormBatch {
 public:
  explicit WeightNormBatch(Module& root);
  ~WeightNormBatch();
  WeightNormBatch(const WeightNormBatch&) = delete;
  WeightNormBatch& operator=(const WeightNormBatch&) = delete;

 private:
  std::vector<ConvLayer*> layers_;
};

struct ConvLayerOptions {
  bool weight_norm = false;
  bool bias = true;
};

// The weight shape of a layer: [out, in / groups, k...] for a convolution,
// [in, out / groups, k...] for a transposed one, with `dims` kernel sizes
// k; throws naming the layer when a channel count is not divisible by groups.
Shape conv_weight_shape(int dims, bool transposed, int64_t in, int64_t out, int64_t kernel, int64_t groups);
// The same with one size per dimension (a 2-D kernel kh x kw).
Shape conv_weight_shape(bool transposed, int64_t in, int64_t out, const Shape& kernel, int64_t groups);

// The streams of the causal 1-D layers (Layer::stream). A convolution
// keeps the inputs its next output needs, which starts as its left
// padding: dil (K - 1) - (stride - 1) zeros. A transposed one keeps its
// last frame's overhang (the first dil (K - 1) + 1 - stride samples of the
// next frame's span, without the bias) and adds it to the next frame's: a
// sum of two chains, which float addition gives in the bits of the
// double sum the whole-input op rounds (two floats' double sum rounds to
// their float sum), so it streams where a sample takes at most two frames:
// an overhang of at most the stride (kernel 2 stride, the codec's).
Tensor conv1d_stream(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv1dOptions& o,
                     StreamState& state);
Tensor conv_transpose1d_stream(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv1dOptions& o,
                               StreamState& state);

// A convolution layer: `Op` (ops.h) with its options, the weight and bias of
// ConvLayer: square kernels from one size, or a size per dimension.
template <class Options, Tensor (*Op)(const Tensor&, const Tensor&, const Tensor&, const Options&), int Dims,
          bool Transposed>
class Conv : public ConvLayer {
 public:
  Conv(int64_t in, int64_t out, int64_t kernel, Generator& gen, const Options& o = {},
       const ConvLayerOptions& layer = {})
      : ConvLayer(conv_weight_shape(Dims, Transposed, in, out, kernel, o.groups), out, gen, layer.weight_norm,
                  layer.bias),
        options(o) {}
  // A kernel of its own size per dimension: the 2-D layers' kh x kw (the
  // adversarial discriminators' (5, 1) and (9, 3) kernels, train/discriminators.h).
  Conv(int64_t in, int64_t out, const std::array<int64_t, Dims>& kernel, Generator& gen, const Options& o = {},
       const ConvLayerOptions& layer = {})
      : ConvLayer(conv_weight_shape(Transposed, in, out, Shape(kernel.begin(), kernel.end()), o.groups), out, gen,
                  layer.weight_norm, layer.bias),
        options(o) {}
  Tensor forward(const Tensor& x) override { return Op(x, weight(), bias, options); }
  Tensor stream(const Tensor& x, StreamState& state) override {
    if constexpr (Dims == 1)
      return (Transposed ? conv_transpose1d_stream : conv1d_stream)(x, weight(), bias, options, state);
    else
      return Layer::stream(x, state);
  }
  Options options;
};

using Conv1d = Conv<Conv1dOptions, conv1d, 1, false>;
using ConvTranspose1d = Conv<Conv1dOptions, conv_transpose1d, 1, true>;
using Conv2d = Conv<ConvOptions, conv2d, 2, false>;
using ConvTranspose2d = Conv<ConvOptions, conv_transpose2d, 2, true>;

}  // namespace vqddp
