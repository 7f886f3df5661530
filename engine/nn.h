// nn: modules with named parameters and named buffers.
//
// Parameters are trained by the optimizer; buffers are state that is not
// (an EMA codebook's embed, embed_avg, cluster_size). Both are listed by
// dotted names ("encoder.0.weight") in registration order, which is the
// order DDP broadcasts them and checkpoints store them, so it must not
// depend on anything but the code that built the model.
#pragma once

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/random.h"
#include "engine/core/tensor.h"

namespace vqddp {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// The values a parameter or buffer may hold, inclusive; float values must
// also be finite. Checked on state that comes from outside the process (a
// checkpoint) before it replaces anything: a negative count or a NaN weight
// resumed silently would poison every later step. A buffer's range is given
// where the module that owns it registers it, so the rule sits next to the
// code that relies on it.
struct ValueRange {
  double min = -INFINITY, max = INFINITY;

  static ValueRange non_negative() { return {0, INFINITY}; }
  static ValueRange exactly(double v) { return {v, v}; }
};
using NamedRanges = std::vector<std::pair<std::string, ValueRange>>;

// The first value of host tensor `t` that `range` forbids, described as
// "-1 at index 3, outside [0, inf]" or "nan at index 0, not finite"; "" if
// every value is allowed.
std::string value_range_violation(const Tensor& t, const ValueRange& range);

// One copy (new storage) of each tensor on `device`: a clone where it
// already is there, else the transfer itself (never a transfer and a clone).
NamedTensors copies_on(const NamedTensors& tensors, Device device);

class Module {
 public:
  virtual ~Module() = default;

  NamedTensors named_parameters() const;
  NamedTensors named_buffers() const;
  // Each buffer's allowed values, by the names and in the order of
  // named_buffers(). (Parameters may hold any finite value.)
  NamedRanges named_buffer_ranges() const;
  std::vector<Tensor> parameters() const;
  // Copies (new storage) of every parameter, then every buffer, by name: a
  // snapshot that later steps cannot change. Each copy stays on its
  // tensor's device, or goes to `device` (the host, to read a GPU model).
  NamedTensors state_copy() const;
  NamedTensors state_copy(Device device) const;

  // Train/eval mode, applied to every submodule.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Training mode AND grad mode: a forward may change state (codebook
  // updates, dropout counters) and issue collectives. An eval pass, or a
  // no-grad validation pass some ranks run on a model left in training
  // mode, does neither.
  bool updates_state() const;

  void zero_grad();

  // fn on this module, then on every submodule, depth first in
  // registration order.
  void for_each_module(const std::function<void(Module&)>& fn);

  // Moves every float parameter and buffer (also of submodules) to `device`
  // in place: the handles members hold follow. int64 buffers (step
  // counters, flags) stay on the host, where control flow reads them with
  // no device round trip; they are identical on every rank anyway.
  void to(Device device);

 protected:
  // Registration returns the tensor handle so members can keep it.
  Tensor& register_parameter(const std::string& name, Tensor t);
  Tensor& register_buffer(const std::string& name, Tensor t, ValueRange range = {});
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  void collect(const std::string& prefix, bool params, NamedTensors& out) const;
  void collect_ranges(const std::string& prefix, NamedRanges& out) const;
  void check_new_name(const std::string& name) const;

  // std::vector (not map) keeps registration order; unique_ptr keeps the
  // handles' addresses stable when more are registered.
  std::vector<std::pair<std::string, std::unique_ptr<Tensor>>> params_, buffers_;
  std::vector<ValueRange> buffer_ranges_;  // one per buffers_ entry
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// What a causal layer stack carries from one stretch of an endless input to
// the next (Layer::stream): one tensor per layer that keeps any, in the
// order the stack visits them, every call visiting every one. The tensors
// are values: a layer replaces its slot and never writes into it, so a
// copy of a StreamState is a fork of the stream.
class StreamState {
 public:
  // The next layer's slot: `init()` on the stream's first stretch.
  Tensor& next(const std::function<Tensor()>& init);
  // Back to the first slot, before a stretch (the stack's owner calls it).
  void rewind() { at_ = 0; }
  // The stream's start again: every slot dropped.
  void clear() {
    slots_.clear();
    at_ = 0;
  }
  int64_t bytes() const;  // what the slots hold

 private:
  std::vector<Tensor> slots_;
  size_t at_ = 0;
};

// A module that maps one tensor to one tensor: what Sequential chains.
class Layer : public Module {
 public:
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }
  // The forward over the next stretch x [N, C, m] (m >= 0) of an endless
  // input [N, C, ...], given what the stretches before left in `state`:
  // the outputs that x completes, the same bits as forward() over the whole
  // input gives at their positions. Causal layers only (a stride-s layer
  // gives an output per s inputs, when its last one arrives); the others
  // refuse.
  virtual Tensor stream(const Tensor& x, StreamState& state);
};

// y = x W^T + b, x [N, in] -> y [N, out]. Initialised like PyTorch's
// nn.Linear: weight and bias uniform in +-1/sqrt(in).
class Linear : public Layer {
 public:
  Linear(int64_t in_features, int64_t out_features, Generator& gen, bool bias = true);
  Tensor forward(const Tensor& x) override;

  Tensor weight;  // (out, in)
  Tensor bias;    // (out), undefined without bias
};

// torch.nn.LayerNorm over the last dimension of [N, D]:
//   y = (x - mean) / sqrt(var + eps) * weight + bias
// with the biased variance; weight 1 and bias 0 at init. Rows are
// independent (batch-invariant).
class LayerNorm : public Layer {
 public:
  // affine false: no weight and bias (torch's elementwise_affine=False).
  explicit LayerNorm(int64_t dim, float eps = 1e-5f, bool affine = true);
  Tensor forward(const Tensor& x) override;

  Tensor weight;  // (D); undefined without affine
  Tensor bias;    // (D); undefined without affine

 private:
  int64_t dim_;
  float eps_;
};

// Modules named 0, 1, ... under one name (torch's ModuleList): the state
// names "<list>.<i>.<member>" of a list of submodules.
class ModuleList : public Module {
 public:
  template <class M>
  std::shared_ptr<M> append(std::shared_ptr<M> m) {
    return register_module(std::to_string(size_++), std::move(m));
  }
  int size() const { return size_; }

 private:
  int size_ = 0;
};

// An elementwise function as a layer (relu, gelu, tanh, ...).
class Activation : public Layer {
 public:
  explicit Activation(std::function<Tensor(const Tensor&)> fn) : fn_(std::move(fn)) {}
  Tensor forward(const Tensor& x) override { return fn_(x); }
  // Elementwise: each stretch on its own.
  Tensor stream(const Tensor& x, StreamState&) override { return x.numel() == 0 ? x : fn_(x); }

 private:
  std::function<Tensor(const Tensor&)> fn_;
};

// x + inner(x): a residual block (inner must keep the shape). The child is
// named "block".
class Residual : public Layer {
 public:
  explicit Residual(std::shared_ptr<Layer> inner);
  Tensor forward(const Tensor& x) override;
  Tensor stream(const Tensor& x, StreamState& state) override;  // inner must give an output per input

 private:
  std::shared_ptr<Layer> inner_;
};

// Applies its layers in order; children are named "0", "1", ...
class Sequential : public Layer {
 public:
  Sequential() = default;
  Sequential& add(std::shared_ptr<Layer> layer);
  Tensor forward(const Tensor& x) override;
  Tensor stream(const Tensor& x, StreamState& state) override;
  size_t size() const { return layers_.size(); }

 private:
  std::vector<std::shared_ptr<Layer>> layers_;
};

}  // namespace vqddp
