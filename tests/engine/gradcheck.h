// Finite-difference gradient checks shared by the tests.
//
// Both compare the analytic gradient of L(x) = sum_j w_j f(x)_j (fixed
// random weights w in [0.5, 1.5), so no gradient cancels by symmetry; L
// summed in double from the float32 outputs) with central differences.
//
// check_gradient (the older, loose check; kept for composite functions
// such as test_spectral's STFT and the GPU suite's on-device checks): one
// step eps = 1e-2, |analytic - numeric| <= atol + rtol |numeric| with
// atol = 2e-3, rtol = 1e-2.
//
// richardson_check (the op table's, tests/engine/op_table.h): every input
// that requires grad is first rounded to multiples of q = 2^(e - 24), where
// 2^e > max |x| + h, so x +- h and x +- h/2 are floats and every step is
// exactly symmetric (an asymmetry of half an ulp would add f'' ulp / 2,
// more than the floor below for a small gradient). Then, for every element
// x_i, with steps s = h and s = h/2 (h = 2^-7):
//   D(s) = sum_j w_j (y_j(x_i + s) - y_j(x_i - s)) / (2 s)
// and Richardson's extrapolation
//   R = (4 D(h/2) - D(h)) / 3
// removes the h^2 term of the central difference (its error is O(h^4)).
// The analytic gradient g_i passes when |g_i - R| <= tol_i with
//   tol_i = (4 E(h/2) + E(h)) / 3     float32 evaluation noise of R
//         + |D(h) - D(h/2)|            Richardson's error estimate (3/4 of
//                                      D(h/2)'s h^2 term; only noise for
//                                      an op linear in x_i)
//         + 1e-6 |R|                   floor: the float32 gradient itself
//   E(s)  = c u N(s) / (2 s)           the noise of D(s), u = 2^-24, with
//   N(s)  = sum_j |w_j| (|y_j(x_i + s)| + |y_j(x_i - s)|) over the outputs
//           j that change with x_i (an output whose bits do not change is
//           the same float in both evaluations: it adds no noise), and
//   c     = 8 + 2 K                    roundings per output: 8 ulp for a
//           chain of elementwise ops (libm within 2 ulp each) or a double
//           accumulation rounded once, and 2 more per product of a float32
//           GEMM of K products (matmul, conv: the op table's gemm_k).
// Over the whole op table the largest |g_i - R| / tol_i is below 0.1. A
// mean over 24 elements on [-1, 1) gets tol ~ 4e-5 |w|, while a backward
// of 1/23 instead of 1/24 is off by |w| / 552 = 1.8e-3 |w| (test_op_table).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/core/random.h"

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

struct GradCheckResult {
  bool ok = true;
  std::string failure;   // the first element out of tolerance, or the input no gradient reached
  double worst = 0.0;    // the largest |analytic - R| / tol over every element checked
  std::string worst_at;  // and where
  int64_t checked = 0;   // elements checked
};

// The check above (formula in this file's header) of every input that
// requires grad; float32 CPU inputs. gemm_k: the number of products a
// float32 GEMM under f sums into one output (0 for none).
inline GradCheckResult richardson_check(const Fn& f, std::vector<Tensor> inputs, int64_t gemm_k = 0,
                                        double h = 0x1p-7) {
  constexpr double kUnit = 0x1p-24;
  const double c = 8.0 + 2.0 * static_cast<double>(gemm_k);
  GradCheckResult result;
  // Fresh leaves (the caller's tensors keep their values and gradients)
  // on the grid of multiples of q = 2^(e - 24), 2^e > max |x| + h: then
  // x +- h and x +- h/2 are floats, and both steps exactly symmetric.
  for (Tensor& x : inputs) {
    if (!x.requires_grad()) continue;
    x = x.detach().clone();
    float* p = x.data<float>();
    double top = h;
    for (int64_t i = 0; i < x.numel(); ++i) top = std::max(top, std::abs(double(p[i])) + h);
    int e = 0;
    std::frexp(top, &e);
    const double q = std::ldexp(1.0, e - 24);
    if (std::fmod(h / 2, q) != 0) {
      result.ok = false;
      result.failure = "the step h / 2 is not a multiple of the inputs' grid (values too large for h)";
      return result;
    }
    for (int64_t i = 0; i < x.numel(); ++i) p[i] = static_cast<float>(std::nearbyint(p[i] / q) * q);
    x.set_requires_grad(true);
  }
  Generator gen(1234, 99);
  std::vector<float> y0;
  Tensor w;
  {
    NoGradGuard g;
    Tensor y = f(inputs);
    y0 = y.to_vector<float>();
    w = rand_uniform(y.shape(), gen, 0.5f, 1.5f);
  }
  const std::vector<float> wv = w.to_vector<float>();
  for (Tensor& x : inputs) x.zero_grad();
  Tensor loss = sum(mul(f(inputs), w));
  if (loss.requires_grad()) loss.backward();  // else no input's gradient is defined: reported below
  auto eval = [&](float* px, int64_t i, float value) {
    px[i] = value;
    NoGradGuard g;
    std::vector<float> y = f(inputs).to_vector<float>();
    return y;
  };
  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor& x = inputs[k];
    if (!x.requires_grad()) continue;
    if (!x.grad().defined()) {
      result.ok = false;
      result.failure = "no gradient reached input " + std::to_string(k);
      return result;
    }
    const std::vector<float> analytic = x.grad().to_vector<float>();
    float* px = x.data<float>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float saved = px[i];
      double d[2], e[2];
      std::vector<float> yu[2], yd[2];
      double step[2];
      for (int s = 0; s < 2; ++s) {
        double hs = s == 0 ? h : h / 2;
        float up = static_cast<float>(saved + hs), down = static_cast<float>(saved - hs);
        yu[s] = eval(px, i, up);
        yd[s] = eval(px, i, down);
        step[s] = double(up) - double(down);
      }
      px[i] = saved;
      for (int s = 0; s < 2; ++s) {
        double diff = 0.0, mag = 0.0;
        for (size_t j = 0; j < y0.size(); ++j) {
          diff += double(wv[j]) * (double(yu[s][j]) - double(yd[s][j]));
          bool changed = yu[0][j] != y0[j] || yd[0][j] != y0[j] || yu[1][j] != y0[j] || yd[1][j] != y0[j];
          if (changed) mag += std::abs(double(wv[j])) * (std::abs(double(yu[s][j])) + std::abs(double(yd[s][j])));
        }
        d[s] = diff / step[s];
        e[s] = c * kUnit * mag / step[s];
      }
      const double r = (4 * d[1] - d[0]) / 3;
      const double tol = (4 * e[1] + e[0]) / 3 + std::abs(d[0] - d[1]) + 1e-6 * std::abs(r);
      const double err = std::abs(double(analytic[i]) - r);
      ++result.checked;
      const double ratio = err == 0 ? 0.0 : tol > 0 ? err / tol : INFINITY;
      const bool fails = !(err <= tol);
      if (ratio > result.worst || (fails && result.ok)) {
        std::ostringstream msg;
        msg.precision(9);
        msg << "input " << k << " element " << i << ": analytic " << analytic[i] << ", numeric " << r
            << " (D(h) " << d[0] << ", D(h/2) " << d[1] << "), |difference| " << err << (fails ? " > " : " <= ")
            << "tolerance " << tol;
        if (ratio > result.worst) result.worst = ratio, result.worst_at = msg.str();
        if (fails && result.ok) result.ok = false, result.failure = msg.str();
      }
    }
  }
  return result;
}

// A leaf tensor of `shape` with values uniform in [low, high).
inline Tensor param(const Shape& shape, uint64_t seed, float low = -1.f, float high = 1.f) {
  Generator gen(seed, 7);
  Tensor t = rand_uniform(shape, gen, low, high);
  t.set_requires_grad(true);
  return t;
}

}  // namespace vqddp::test
