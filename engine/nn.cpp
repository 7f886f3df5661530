#include "engine/nn.h"

#include <cmath>

#include "engine/autograd.h"
#include "engine/ops.h"

namespace vqddp {

void Module::check_new_name(const std::string& name) const {
  VQDDP_CHECK(!name.empty() && name.find('.') == std::string::npos, "bad member name '{}' (empty or contains '.')", name);
  auto taken = [&](const auto& list) {
    for (const auto& [n, _] : list)
      if (n == name) return true;
    return false;
  };
  VQDDP_CHECK(!taken(params_) && !taken(buffers_) && !taken(children_), "name '{}' is registered twice", name);
}

Tensor& Module::register_parameter(const std::string& name, Tensor t) {
  check_new_name(name);
  VQDDP_CHECK(t.dtype() == DType::f32, "parameter '{}' must be float32, got {}", name, t.desc());
  t.set_requires_grad(true);
  params_.emplace_back(name, std::make_unique<Tensor>(std::move(t)));
  return *params_.back().second;
}

Tensor& Module::register_buffer(const std::string& name, Tensor t, ValueRange range) {
  check_new_name(name);
  buffers_.emplace_back(name, std::make_unique<Tensor>(std::move(t)));
  buffer_ranges_.push_back(range);
  return *buffers_.back().second;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_new_name(name);
  VQDDP_CHECK(m != nullptr, "submodule '{}' is null", name);
  m->train(training_);
  children_.emplace_back(name, std::move(m));
}

void Module::collect(const std::string& prefix, bool params, NamedTensors& out) const {
  for (const auto& [name, t] : params ? params_ : buffers_) out.emplace_back(prefix + name, *t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", params, out);
}

void Module::collect_ranges(const std::string& prefix, NamedRanges& out) const {
  for (size_t i = 0; i < buffers_.size(); ++i) out.emplace_back(prefix + buffers_[i].first, buffer_ranges_[i]);
  for (const auto& [name, child] : children_) child->collect_ranges(prefix + name + ".", out);
}

NamedRanges Module::named_buffer_ranges() const {
  NamedRanges out;
  collect_ranges("", out);
  return out;
}

namespace {

// The first element of `p[0..n)` outside `range`. Compared as doubles: exact
// for every int64 near the small bounds ranges use (0, 1), and a value far
// from them stays far from them after rounding.
template <class T>
std::string first_violation(const T* p, int64_t n, const ValueRange& range) {
  for (int64_t i = 0; i < n; ++i) {
    double v = static_cast<double>(p[i]);
    if (!std::isfinite(v)) return fmt::format("{} at index {}, not finite", p[i], i);
    if (v < range.min || v > range.max) return fmt::format("{} at index {}, outside [{}, {}]", p[i], i, range.min, range.max);
  }
  return "";
}

}  // namespace

std::string value_range_violation(const Tensor& t, const ValueRange& range) {
  switch (t.dtype()) {
    case DType::f32: return first_violation(t.data<float>(), t.numel(), range);
    case DType::f64: return first_violation(t.data<double>(), t.numel(), range);
    case DType::i64: return first_violation(t.data<int64_t>(), t.numel(), range);
  }
  return "";
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", true, out);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", false, out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [_, t] : named_parameters()) out.push_back(t);
  return out;
}

NamedTensors Module::state_copy() const {
  NamedTensors out;
  for (auto& [n, t] : named_parameters()) out.emplace_back(n, t.clone());
  for (auto& [n, t] : named_buffers()) out.emplace_back(n, t.clone());
  return out;
}

NamedTensors copies_on(const NamedTensors& tensors, Device device) {
  NamedTensors out;
  for (const auto& [n, t] : tensors) out.emplace_back(n, t.device() == device ? t.clone() : t.detach().to(device));
  return out;
}

NamedTensors Module::state_copy(Device device) const {
  NamedTensors out = copies_on(named_parameters(), device);
  for (auto& named : copies_on(named_buffers(), device)) out.push_back(std::move(named));
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [_, child] : children_) child->train(on);
}

bool Module::updates_state() const { return training_ && grad_enabled(); }

void Module::for_each_module(const std::function<void(Module&)>& fn) {
  fn(*this);
  for (auto& [name, child] : children_) child->for_each_module(fn);
}

void Module::zero_grad() {
  for (auto& [_, t] : named_parameters()) t.zero_grad();
}

void Module::to(Device device) {
  for (auto& [_, t] : named_parameters()) t.move_to_(device);
  for (auto& [_, t] : named_buffers())
    if (t.dtype() != DType::i64) t.move_to_(device);
}

Linear::Linear(int64_t in, int64_t out, Generator& gen, bool with_bias) {
  VQDDP_CHECK(in > 0 && out > 0, "Linear({}, {}): sizes must be positive", in, out);
  float bound = 1.f / std::sqrt(static_cast<float>(in));
  weight = register_parameter("weight", rand_uniform({out, in}, gen, -bound, bound));
  if (with_bias) bias = register_parameter("bias", rand_uniform({out}, gen, -bound, bound));
}

LayerNorm::LayerNorm(int64_t dim, float eps, bool affine) : dim_(dim), eps_(eps) {
  VQDDP_CHECK(dim > 0, "LayerNorm({}): the size must be positive", dim);
  if (!affine) return;
  weight = register_parameter("weight", full({dim}, 1.0));
  bias = register_parameter("bias", full({dim}, 0.0));
}

Tensor LayerNorm::forward(const Tensor& x) {
  VQDDP_CHECK(x.dim() == 2 && x.size(1) == dim_, "LayerNorm({}) expects [N, {}], got {}", dim_, dim_, x.desc());
  Tensor centred = sub(x, mean(x, 1, /*keepdim=*/true));
  Tensor var = mean(square(centred), 1, /*keepdim=*/true);
  Tensor normed = div(centred, vqddp::sqrt(add(var, eps_)));
  return weight.defined() ? add(mul(normed, weight), bias) : normed;
}

Residual::Residual(std::shared_ptr<Layer> inner) : inner_(register_module("block", std::move(inner))) {}

Tensor Residual::forward(const Tensor& x) {
  Tensor y = inner_->forward(x);
  VQDDP_CHECK(y.shape() == x.shape(), "Residual: the block maps {} to {}; it must keep the shape", x.desc(), y.desc());
  return add(x, y);
}

Tensor Residual::stream(const Tensor& x, StreamState& state) {
  Tensor y = inner_->stream(x, state);  // always: its layers' slots stay in order
  VQDDP_CHECK(y.shape() == x.shape(), "Residual: the block streams {} to {}; it must give an output per input",
              x.desc(), y.desc());
  return x.numel() == 0 ? x : add(x, y);
}

Tensor& StreamState::next(const std::function<Tensor()>& init) {
  if (at_ == slots_.size()) slots_.push_back(init());
  return slots_[at_++];
}

int64_t StreamState::bytes() const {
  int64_t n = 0;
  for (const Tensor& t : slots_) n += t.numel() * static_cast<int64_t>(dtype_size(t.dtype()));
  return n;
}

Tensor Layer::stream(const Tensor&, StreamState&) {
  VQDDP_THROW("this layer cannot stream: only causal convolutions (Conv1dOptions::causal), elementwise activations "
             "and stacks and residual blocks of them can");
}

Tensor Linear::forward(const Tensor& x) {
  VQDDP_CHECK(x.dim() == 2 && x.size(1) == weight.size(1), "Linear: expected input [N, {}], got {}", weight.size(1),
              x.desc());
  Tensor y = matmul(x, weight, false, true);  // (N, out)
  return bias.defined() ? add(y, bias) : y;
}

Sequential& Sequential::add(std::shared_ptr<Layer> layer) {
  register_module(std::to_string(layers_.size()), layer);
  layers_.push_back(std::move(layer));
  return *this;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& layer : layers_) y = layer->forward(y);
  return y;
}

Tensor Sequential::stream(const Tensor& x, StreamState& state) {
  Tensor y = x;
  for (auto& layer : layers_) y = layer->stream(y, state);
  return y;
}

}  // namespace vqddp
