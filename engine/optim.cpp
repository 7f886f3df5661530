#include "engine/optim.h"

#include <cmath>

#include <fmt/format.h>

#include "engine/device_plans.h"
#include "engine/kernel_math.h"

namespace vqddp {

Optimizer::Optimizer(std::vector<Tensor> params) : params_(std::move(params)) {
  for (size_t i = 0; i < params_.size(); ++i)
    VQDDP_CHECK(params_[i].defined() && params_[i].dtype() == DType::f32, "optimizer parameter {} is not a float32 tensor", i);
}

void Optimizer::zero_grad() {
  for (Tensor& p : params_) p.zero_grad();
}

static NamedTensors indexed(const char* name, const std::vector<Tensor>& ts) {
  NamedTensors out;
  for (size_t i = 0; i < ts.size(); ++i) out.emplace_back(fmt::format("{}.{}", name, i), ts[i]);
  return out;
}

static std::vector<Tensor> zeros_like_all(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(zeros_like(t));
  return out;
}

Sgd::Sgd(std::vector<Tensor> params, SgdOptions o)
    : Optimizer(std::move(params)), opt_(o), momentum_(zeros_like_all(params_)), started_(zeros({1}, DType::i64)) {
  lr = o.lr;
}

void Sgd::step() {
  SgdStep s{lr, opt_.momentum, opt_.weight_decay, opt_.nesterov, started_.data<int64_t>()[0] == 0};
  // The rate travels in device memory, uploaded each step (AdamW::step).
  Tensor scalars;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = params_[i].grad();
    if (!g.defined()) continue;
    int64_t n = params_[i].numel();
    if (!scalars.defined()) scalars = from_vector(std::vector<float>{lr}, {1}).to(params_[i].device());
    s.scalars = static_cast<const float*>(scalars.raw_ptr());
    device_of("Sgd::step", {&params_[i], &g, &momentum_[i], &scalars})
        .sgd_step(s, static_cast<float*>(params_[i].raw_ptr()), static_cast<const float*>(g.raw_ptr()),
                  static_cast<float*>(momentum_[i].raw_ptr()), n);
    params_[i].bump_version();
  }
  started_.data<int64_t>()[0] = 1;
}

NamedRanges Sgd::state_ranges() const { return {{"started", ValueRange{0, 1}}}; }

NamedTensors Sgd::state() {
  NamedTensors out = indexed("momentum", momentum_);
  out.emplace_back("started", started_);
  return out;
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions o)
    : Optimizer(std::move(params)),
      opt_(o),
      exp_avg_(zeros_like_all(params_)),
      exp_avg_sq_(zeros_like_all(params_)) {
  for (size_t i = 0; i < params_.size(); ++i) steps_.push_back(zeros({1}, DType::i64));
  lr = o.lr;
}

void AdamW::step() {
  // Every parameter in one multi-tensor call (one launch on a GPU). The
  // rate and the bias corrections, which change every step, travel in
  // device memory, uploaded each step: a step graph (engine/step_graph.h)
  // replays the launch with this step's values.
  std::vector<AdamWTensor> list;
  std::vector<float> scalars{lr};
  DeviceKernels* dk = nullptr;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = params_[i].grad();
    if (!g.defined()) continue;
    // Steps count per parameter, as in PyTorch: a parameter that first gets
    // a gradient late starts its bias correction at 1. Corrections in
    // double: 1 - beta^t loses digits in float for large t.
    int64_t t = ++steps_[i].data<int64_t>()[0];
    DeviceKernels& k = device_of("AdamW::step", {&params_[i], &g, &exp_avg_[i], &exp_avg_sq_[i]});
    VQDDP_CHECK(!dk || dk == &k, "AdamW::step: parameter {} is on another device than parameter 0", i);
    dk = &k;
    list.push_back({static_cast<float*>(params_[i].raw_ptr()), static_cast<const float*>(g.raw_ptr()),
                    static_cast<float*>(exp_avg_[i].raw_ptr()), static_cast<float*>(exp_avg_sq_[i].raw_ptr()),
                    params_[i].numel(), static_cast<int64_t>(scalars.size())});
    scalars.push_back(static_cast<float>(1.0 - std::pow(double(opt_.beta1), double(t))));
    scalars.push_back(static_cast<float>(std::sqrt(1.0 - std::pow(double(opt_.beta2), double(t)))));
    params_[i].bump_version();
  }
  if (list.empty()) return;
  const auto n = static_cast<int64_t>(scalars.size());
  Tensor on_device = from_vector(std::move(scalars), {n}).to(params_[0].device());
  AdamWStep s{lr, opt_.beta1, opt_.beta2, opt_.eps, opt_.weight_decay};
  s.scalars = static_cast<const float*>(on_device.raw_ptr());
  dk->adamw_step(s, list.data(), static_cast<int64_t>(list.size()));
}

NamedRanges AdamW::state_ranges() const {
  NamedRanges out;
  for (size_t i = 0; i < steps_.size(); ++i) out.emplace_back(fmt::format("step.{}", i), ValueRange::non_negative());
  return out;
}

NamedTensors AdamW::state() {
  NamedTensors out = indexed("exp_avg", exp_avg_);
  NamedTensors sq = indexed("exp_avg_sq", exp_avg_sq_);
  NamedTensors steps = indexed("step", steps_);
  out.insert(out.end(), sq.begin(), sq.end());
  out.insert(out.end(), steps.begin(), steps.end());
  return out;
}

Tensor clip_grad_norm(const std::vector<Tensor>& params, float max_norm) {
  // One double accumulator on the gradients' device, in parameter order:
  // on the CPU one running sum over every element (its historical bits); a
  // GPU adds each tensor's fixed-tree sum, so its norm may differ from the
  // CPU's in the last bits, reproducibly.
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  Device device = grads.empty() ? Device::cpu() : grads[0].device();
  Tensor total = zeros({1}, DType::f64, device);
  auto* acc = static_cast<double*>(total.raw_ptr());
  std::vector<float*> xs;
  std::vector<int64_t> ns;
  for (Tensor& g : grads) {
    device_of("clip_grad_norm", {&g, &total});  // one device for all
    xs.push_back(static_cast<float*>(g.raw_ptr()));
    ns.push_back(g.numel());
  }
  DeviceKernels& dk = device_of("clip_grad_norm", {&total});
  const auto count = static_cast<int64_t>(grads.size());
  dk.sum_squares(xs.data(), ns.data(), count, acc);
  dk.clip_scale(xs.data(), ns.data(), count, acc, max_norm);
  for (Tensor& g : grads) g.bump_version();
  Tensor norm = empty({}, DType::f32, device);
  device_of("clip_grad_norm", {&total}).clip_norm(acc, static_cast<float*>(norm.raw_ptr()));
  return norm;
}

}  // namespace vqddp
