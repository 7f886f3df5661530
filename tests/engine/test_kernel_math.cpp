// The float exponential family of engine/kernel_math.h (host and device
// share it) against glibc's double functions rounded to float, over a sweep
// of floats: how many ulp apart, and how often exactly the correctly
// rounded float.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>

#include "engine/kernel_math.h"

using namespace vqddp;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// ulp between two finite floats of the same sign (or zero).
int64_t ulp_apart(float a, float b) {
  auto ordered = [](float f) {
    int32_t i;
    std::memcpy(&i, &f, 4);
    return i < 0 ? int64_t{INT32_MIN} - i : int64_t{i};
  };
  const int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

struct Sweep {
  int64_t samples = 0, exact = 0, worst = 0;
};

// Every 4093rd float for which `in(v)`: f(v) against want(v) in double.
template <class F, class Want, class In>
Sweep sweep(F f, Want want, In in) {
  Sweep s;
  for (uint64_t b = 0; b <= 0xFFFFFFFFull; b += 4093) {
    const uint32_t bits = static_cast<uint32_t>(b);
    float v;
    std::memcpy(&v, &bits, 4);
    if (!in(v)) continue;
    const float w = static_cast<float>(want(static_cast<double>(v)));
    const float got = f(v);
    ++s.samples;
    const int64_t d = ulp_apart(got, w);
    s.exact += d == 0 && std::signbit(got) == std::signbit(w);
    if (d > s.worst) {
      s.worst = d;
      MESSAGE("v = " << v << ": " << got << " against " << w << ", " << d << " ulp");
    }
  }
  return s;
}

}  // namespace

TEST_CASE("expm1_rn (elu's e^v - 1) is within 2 ulp of e^v - 1 and mostly its correctly rounded float") {
  // Measured: 94.5% equal, 5.5% 1 ulp, 0.002% 2 ulp.
  Sweep s = sweep(expm1_rn, [](double v) { return std::expm1(v); }, [](float v) { return v > -30.f && v < 88.7f; });
  CHECK(s.samples > 500000);
  CHECK(s.worst <= 2);
  CHECK(s.exact * 10 >= s.samples * 9);
  CHECK(std::signbit(expm1_rn(-0.f)));
  CHECK(expm1_rn(0.f) == 0.f);
  CHECK(expm1_rn(-100.f) == -1.f);
  CHECK(expm1_rn(-kInf) == -1.f);
  CHECK(std::isfinite(expm1_rn(88.7f)));
  CHECK(std::isinf(expm1_rn(88.8f)));
  CHECK(std::isinf(expm1_rn(kInf)));
  CHECK(std::isnan(expm1_rn(std::nanf(""))));
  CHECK(expm1_rn(1e-30f) == 1e-30f);
}

TEST_CASE("exp_rn is within 2 ulp of e^v, subnormal results included, and overflows and underflows where e^v does") {
  Sweep s = sweep(exp_rn, [](double v) { return std::exp(v); }, [](float v) { return v > -103.f && v < 88.7f; });
  CHECK(s.samples > 500000);
  CHECK(s.worst <= 2);
  CHECK(s.exact * 10 >= s.samples * 9);
  CHECK(exp_rn(0.f) == 1.f);
  CHECK(exp_rn(-0.f) == 1.f);
  CHECK(exp_rn(1.f) == 2.71828183f);
  CHECK(ulp_apart(exp_rn(88.72f), static_cast<float>(std::exp(double{88.72f}))) <= 2);  // just below FLT_MAX
  CHECK(exp_rn(88.73f) == kInf);
  CHECK(exp_rn(kInf) == kInf);
  CHECK(exp_rn(-103.5f) > 0.f);  // subnormal
  CHECK(exp_rn(-104.f) == 0.f);
  CHECK(exp_rn(-kInf) == 0.f);
  CHECK(std::isnan(exp_rn(std::nanf(""))));
}

TEST_CASE("log_rn is within 2 ulp of ln v for every positive float, subnormals included; -inf at 0, NaN below") {
  Sweep s = sweep(log_rn, [](double v) { return std::log(v); }, [](float v) { return v > 0.f && v < kInf; });
  CHECK(s.samples > 500000);
  CHECK(s.worst <= 2);
  CHECK(s.exact * 10 >= s.samples * 9);
  CHECK(log_rn(1.f) == 0.f);
  CHECK(log_rn(2.f) == 0.693147182f);
  const float denorm = std::numeric_limits<float>::denorm_min();
  CHECK(log_rn(denorm) == static_cast<float>(std::log(static_cast<double>(denorm))));
  CHECK(log_rn(0.f) == -kInf);
  CHECK(log_rn(-0.f) == -kInf);
  CHECK(log_rn(kInf) == kInf);
  CHECK(std::isnan(log_rn(-1.f)));
  CHECK(std::isnan(log_rn(-kInf)));
  CHECK(std::isnan(log_rn(std::nanf(""))));
}

TEST_CASE("tanh_rn within 3 ulp of tanh and sigmoid_rn within 2 ulp of 1 / (1 + e^-v), signs and limits kept") {
  // tanh's 3 ulp: expm1_rn's 2 ulp pass through u / (u + 2) near 0.
  Sweep t = sweep(tanh_rn, [](double v) { return std::tanh(v); }, [](float v) { return std::isfinite(v); });
  CHECK(t.samples > 1000000);
  CHECK(t.worst <= 3);
  CHECK(t.exact * 10 >= t.samples * 9);
  CHECK(std::signbit(tanh_rn(-0.f)));
  CHECK(tanh_rn(0.f) == 0.f);
  CHECK(tanh_rn(1e-30f) == 1e-30f);
  CHECK(tanh_rn(10.f) == 1.f);
  CHECK(tanh_rn(-kInf) == -1.f);
  CHECK(std::isnan(tanh_rn(std::nanf(""))));
  Sweep s = sweep(sigmoid_rn, [](double v) { return 1.0 / (1.0 + std::exp(-v)); },
                  [](float v) { return v > -87.f && v < kInf; });
  CHECK(s.samples > 500000);
  CHECK(s.worst <= 2);
  CHECK(s.exact * 10 >= s.samples * 9);
  CHECK(sigmoid_rn(0.f) == 0.5f);
  CHECK(sigmoid_rn(kInf) == 1.f);
  CHECK(sigmoid_rn(-kInf) == 0.f);
}

TEST_CASE("the exact-sum grid: q is the power of two 2^27 below the largest value's binade, rounding is exact, and "
          "2^26 values of the largest size sum exactly in float64 in any order") {
  CHECK(grid_quantum(1.0) == std::ldexp(1.0, -26));  // 1 = 0.5 * 2^1
  CHECK(grid_quantum(0.75) == std::ldexp(1.0, -27));
  CHECK(grid_quantum(3.0e38) == std::ldexp(1.0, 128 - 27));
  CHECK(grid_quantum(std::ldexp(1.0, -149)) == std::ldexp(1.0, -148 - 27));  // the smallest float: q still normal
  for (double nothing : {0.0, static_cast<double>(kInf), std::nan("")}) CHECK(grid_quantum(nothing) == 1.0);
  // Every value up to the largest lands on at most 2^27 steps, exactly.
  const double largest = 0.7342, q = grid_quantum(largest);
  for (double x : {largest, -largest, 1e-9, 0.123456789, -0.5}) {
    CAPTURE(x);
    double g = to_grid(static_cast<float>(x), q);
    CHECK(std::fabs(g / q) <= std::ldexp(1.0, kGridValueBits));
    CHECK(g / q == std::rint(g / q));
    CHECK(std::fabs(g - static_cast<float>(x)) <= q / 2);
  }
  CHECK(to_grid(-0.3, q) == -to_grid(0.3, q));
  // Our constants, not the hardware: 2^kGridRowsLog2 values of at most
  // 2^kGridValueBits steps sum to at most 2^53 steps, which a double holds
  // exactly, so a sum in any grouping is the same number. (That doubles
  // add integers below 2^53 exactly is IEEE 754's promise, not ours.)
  CHECK(kGridValueBits + kGridRowsLog2 <= std::numeric_limits<double>::digits);
  CHECK(grid_quantum(largest) * std::ldexp(1.0, kGridValueBits) >= largest);  // the largest value is on the grid's range
}
