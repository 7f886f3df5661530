#include "engine/optim.h"

#include <cmath>

#include <fmt/format.h>

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
  bool first = started_.data<int64_t>()[0] == 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = params_[i].grad();
    if (!g.defined()) continue;
    float* p = params_[i].data<float>();
    const float* pg = g.data<float>();
    float* buf = momentum_[i].data<float>();
    for (int64_t j = 0, n = params_[i].numel(); j < n; ++j) {
      float d = pg[j] + opt_.weight_decay * p[j];
      if (opt_.momentum != 0.f) {
        buf[j] = first ? d : opt_.momentum * buf[j] + d;
        d = opt_.nesterov ? d + opt_.momentum * buf[j] : buf[j];
      }
      p[j] -= lr * d;
    }
    params_[i].bump_version();
  }
  started_.data<int64_t>()[0] = 1;
}

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
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = params_[i].grad();
    if (!g.defined()) continue;
    // Steps count per parameter, as in PyTorch: a parameter that first gets
    // a gradient late starts its bias correction at 1. Corrections in
    // double: 1 - beta^t loses digits in float for large t.
    int64_t t = ++steps_[i].data<int64_t>()[0];
    float c1 = static_cast<float>(1.0 - std::pow(double(opt_.beta1), double(t)));
    float sqrt_c2 = static_cast<float>(std::sqrt(1.0 - std::pow(double(opt_.beta2), double(t))));
    float* p = params_[i].data<float>();
    const float* pg = g.data<float>();
    float* m = exp_avg_[i].data<float>();
    float* v = exp_avg_sq_[i].data<float>();
    for (int64_t j = 0, n = params_[i].numel(); j < n; ++j) {
      p[j] -= lr * opt_.weight_decay * p[j];
      m[j] = opt_.beta1 * m[j] + (1.f - opt_.beta1) * pg[j];
      v[j] = opt_.beta2 * v[j] + (1.f - opt_.beta2) * pg[j] * pg[j];
      p[j] -= lr * (m[j] / c1) / (std::sqrt(v[j]) / sqrt_c2 + opt_.eps);
    }
    params_[i].bump_version();
  }
}

NamedTensors AdamW::state() {
  NamedTensors out = indexed("exp_avg", exp_avg_);
  NamedTensors sq = indexed("exp_avg_sq", exp_avg_sq_);
  NamedTensors steps = indexed("step", steps_);
  out.insert(out.end(), sq.begin(), sq.end());
  out.insert(out.end(), steps.begin(), steps.end());
  return out;
}

float clip_grad_norm(const std::vector<Tensor>& params, float max_norm) {
  double total = 0.0;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    const float* pg = g.data<float>();
    for (int64_t j = 0, n = g.numel(); j < n; ++j) total += double(pg[j]) * pg[j];
  }
  double norm = std::sqrt(total);
  // Same epsilon as torch.nn.utils.clip_grad_norm_, so runs compare.
  double scale = max_norm / (norm + 1e-6);
  if (scale < 1.0) {
    for (const Tensor& p : params) {
      Tensor g = p.grad();
      if (!g.defined()) continue;
      float* pg = g.data<float>();
      for (int64_t j = 0, n = g.numel(); j < n; ++j) pg[j] = static_cast<float>(pg[j] * scale);
      g.bump_version();
    }
  }
  return static_cast<float>(norm);
}

}  // namespace vqddp
