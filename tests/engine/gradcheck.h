// Finite-difference gradient check shared by the engine tests.
//
// L(x) = sum_i w_i f(x)_i with fixed random weights w (so no gradient
// cancels by symmetry). The analytic gradient comes from backward(); the
// numeric one from central differences with step eps, where L is summed in
// double from the float outputs. Tolerance: |analytic - numeric| <=
// atol + rtol * |numeric| with eps = 1e-2, atol = 2e-3, rtol = 1e-2: float32
// evaluation noise is about 1e-7 * |L| / eps and the truncation error
// about eps^2 * f''' / 6, both well inside.
#pragma once

#include <doctest/doctest.h>

#include <functional>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/random.h"

namespace vqddp::test {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

inline double weighted_sum(const Tensor& y, const Tensor& w) {
  double acc = 0.0;
  const float *py = y.data<float>(), *pw = w.data<float>();
  for (int64_t i = 0; i < y.numel(); ++i) acc += double(py[i]) * pw[i];
  return acc;
}

// Checks the gradient of every input that requires grad.
inline void check_gradient(const char* name, const Fn& f, std::vector<Tensor> inputs, double eps = 1e-2,
                           double atol = 2e-3, double rtol = 1e-2) {
  Generator gen(1234, 99);
  Tensor y0;
  {
    NoGradGuard g;
    y0 = f(inputs);
  }
  Tensor w = rand_uniform(y0.shape(), gen, 0.5f, 1.5f);
  for (Tensor& x : inputs) x.zero_grad();
  Tensor loss = sum(mul(f(inputs), w));
  loss.backward();
  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor& x = inputs[k];
    if (!x.requires_grad()) continue;
    Tensor analytic = x.grad();
    REQUIRE_MESSAGE(analytic.defined(), name, ": no gradient reached input ", k);
    float* px = x.data<float>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      float saved = px[i];
      NoGradGuard g;
      px[i] = saved + static_cast<float>(eps);
      double up = weighted_sum(f(inputs), w);
      px[i] = saved - static_cast<float>(eps);
      double down = weighted_sum(f(inputs), w);
      px[i] = saved;
      double numeric = (up - down) / (2 * eps);
      double a = analytic.data<float>()[i];
      CHECK_MESSAGE(std::abs(a - numeric) <= atol + rtol * std::abs(numeric), name, ": input ", k, " element ", i,
                    " analytic ", a, " numeric ", numeric);
    }
  }
}

// A leaf tensor of `shape` with values uniform in [low, high).
inline Tensor param(const Shape& shape, uint64_t seed, float low = -1.f, float high = 1.f) {
  Generator gen(seed, 7);
  Tensor t = rand_uniform(shape, gen, low, high);
  t.set_requires_grad(true);
  return t;
}

}  // namespace vqddp::test
