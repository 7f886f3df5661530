// FLOPs counted per kernel-table call (engine/kernel_flops.h): each call
// once, by its formula, on the CPU and on sim alike, and charged to the op
// that made it in the profile (engine/op_profile.h).
#include <doctest/doctest.h>

#include "engine/autograd.h"
#include "engine/device_counters.h"
#include "engine/gemm_floor.h"
#include "engine/op_profile.h"
#include "engine/ops.h"
#include "engine/core/random.h"

using namespace vqddp;

namespace {

int64_t flops_of(const std::function<void()>& f) {
  const int64_t before = device_counters().flops;
  f();
  return device_counters().flops - before;
}

}  // namespace

TEST_CASE("a convolution counts 2 MACs a weight tap and one add a bias, once, on the direct and the column path, "
          "on cpu and sim") {
  // Stride 1 takes the direct kernels, stride 2 along the width the column
  // path (im2col and the fixed GEMM inside conv_fixed, which must not count
  // again as a GEMM of their own).
  for (Device dev : {Device::cpu(), Device::sim()}) {
    for (int64_t stride : {1, 2}) {
      CAPTURE(dev.str());
      CAPTURE(stride);
      Generator g(5, 0);
      Tensor x = rand_normal({2, 3, 5, 9}, g).to(dev), w = rand_normal({4, 3, 3, 3}, g).to(dev),
             b = rand_normal({4}, g).to(dev);
      ConvOptions o;
      o.stride = {1, stride};
      o.padding = {1, 1};
      const int64_t oh = 5, ow = stride == 1 ? 9 : 5;
      const int64_t positions = 2 * oh * ow;
      CHECK(flops_of([&] { conv2d(x, w, b, o); }) == 2 * positions * 4 * (3 * 3 * 3) + positions * 4);
      // The transposed convolution of the same weight: the plain one's data
      // gradient, the same products.
      Tensor y = rand_normal({2, 3, 5, 9}, g).to(dev), wt = rand_normal({3, 4, 3, 3}, g).to(dev);
      ConvOptions t;
      t.padding = {1, 1};
      CHECK(flops_of([&] { conv_transpose2d(y, wt, Tensor(), t); }) == 2 * (2 * 5 * 9) * 3 * (4 * 3 * 3));
    }
  }
}

TEST_CASE("a matmul counts 2 m n k forward and twice that backward; the profile charges each op its own") {
  for (Device dev : {Device::cpu(), Device::sim()}) {
    CAPTURE(dev.str());
    Tensor a = full({64, 32}, 0.5).to(dev), b = full({32, 16}, 0.25).to(dev);
    a.set_requires_grad(true);
    b.set_requires_grad(true);
    op_profile_take();
    {
      OpProfileScope scope(dev);
      Tensor y = sum(matmul(a, b));
      y.backward();
    }
    std::vector<OpProfileEntry> table = op_profile_take();
    auto flops = [&](const std::string& name) {
      for (const OpProfileEntry& e : table)
        if (e.name == name) return e.flops;
      return int64_t{-1};
    };
    CHECK(flops("matmul") == 2 * 64 * 16 * 32);
    CHECK(flops("matmul backward: matmul") == 2 * (2 * 64 * 16 * 32));  // dA and dB
    CHECK(flops("sum") == 64 * 16);
    // The table shows GFLOP per step and, given a floor, each op's share of it.
    const std::string text = op_profile_table(table, 1, {.gflops = 100, .share = 1});
    CHECK(text.find("GFLOP/step") != std::string::npos);
    CHECK(text.find("floor") != std::string::npos);
    CHECK(op_profile_table(table, 1).find("floor") == std::string::npos);
  }
}

TEST_CASE("the GEMM floor is measured through the device's kernel table, in GFLOP/s") {
  const double cpu = measure_gemm_floor(Device::cpu());
  CHECK(cpu > 0.1);     // any CPU multiplies faster than 100 MFLOP/s
  CHECK(cpu < 1e5);     // and slower than 100 TFLOP/s on its own
}
