// run.precision (engine/precision.h): TF32 and bfloat16 products emulated
// by rounding every product's inputs (operands, and in backward the incoming
// gradient) and accumulating in float32 in the fp32 kernels' fixed order.
// The rounding formulas are the GPU's conversions, and a product in either
// precision is exactly the fp32 product of the rounded inputs, on the CPU
// and on sim alike.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "engine/autograd.h"
#include "engine/exact_batch.h"
#include "engine/kernel_math.h"
#include "engine/ops.h"
#include "engine/precision.h"
#include "engine/core/random.h"

using namespace vqddp;

namespace {

float from_bits(uint32_t b) { return std::bit_cast<float>(b); }
uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

bool same_bits(const Tensor& a, const Tensor& b) {
  std::vector<float> x = a.to(Device::cpu()).to_vector<float>(), y = b.to(Device::cpu()).to_vector<float>();
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("round_to_tf32 and round_to_bf16: the GPU's conversions (nearest, ties away / to even), specials kept") {
  // TF32 keeps 10 mantissa bits: 1 + 2^-11 is halfway between 1 and
  // 1 + 2^-10, and rounds away from zero (cvt.rna), on either sign.
  CHECK(round_to_tf32(1.f + 0x1p-11f) == 1.f + 0x1p-10f);
  CHECK(round_to_tf32(-(1.f + 0x1p-11f)) == -(1.f + 0x1p-10f));
  CHECK(round_to_tf32(1.f + 0x1p-12f) == 1.f);
  CHECK(round_to_tf32(1.f + 0x1p-11f + 0x1p-23f) == 1.f + 0x1p-10f);
  CHECK(bits(round_to_tf32(from_bits(0x3f801fffu))) == 0x3f802000u);
  // bfloat16 keeps 7: halfway cases go to the even neighbour.
  CHECK(round_to_bf16(1.f + 0x1p-8f) == 1.f);                         // 1 is even
  CHECK(round_to_bf16(1.f + 0x1p-7f + 0x1p-8f) == 1.f + 0x1p-6f);     // 1 + 2^-7 is odd: up
  CHECK(round_to_bf16(1.f + 0x1p-8f + 0x1p-23f) == 1.f + 0x1p-7f);    // past halfway: up
  CHECK(bits(round_to_bf16(3.14159274f)) == 0x40490000u);
  // A carry into the exponent, and past the largest finite value.
  CHECK(round_to_bf16(from_bits(0x3fffffffu)) == 2.f);
  CHECK(std::isinf(round_to_tf32(std::numeric_limits<float>::max())));
  for (float special : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()}) {
    CHECK(round_to_tf32(special) == special);
    CHECK(round_to_bf16(special) == special);
  }
  const float nan = from_bits(0x7fc00001u);  // a payload that rounding would clear
  CHECK(bits(round_to_tf32(nan)) == 0x7fc00001u);
  CHECK(bits(round_to_bf16(nan)) == 0x7fc00001u);
  CHECK(bits(round_to_tf32(-0.f)) == 0x80000000u);
  // Already representable: unchanged (rounding twice is rounding once).
  for (float v : {1.5f, -0.375f, 1024.f, 0x1p-130f}) {
    CHECK(round_to_tf32(v) == v);
    CHECK(round_to_bf16(v) == v);
  }
}

TEST_CASE("a product in tf32 or bf16 is the fp32 product of the rounded inputs, gradients too, on the CPU and sim") {
  Generator gen(5, 0);
  const Tensor a = rand_normal({7, 33}, gen), b = rand_normal({33, 9}, gen), up = rand_normal({7, 9}, gen);
  const Tensor x = rand_normal({2, 5, 24}, gen), w = rand_normal({6, 5, 3}, gen), bias = rand_normal({6}, gen),
               gy = rand_normal({2, 6, 22}, gen);
  for (Device dev : {Device::cpu(), Device::sim()})
    for (Precision p : {Precision::tf32, Precision::bf16}) {
      CAPTURE(dev.str());
      CAPTURE(precision_name(p));
      auto rounded = [&](const Tensor& t) { return p == Precision::tf32 ? to_tf32(t) : to_bf16(t); };
      // matmul: forward, and both gradients from the rounded g.
      Tensor da = a.to(dev).detach(), db = b.to(dev).detach();
      da.set_requires_grad(true);
      db.set_requires_grad(true);
      Tensor got;
      {
        PrecisionScope scope(p);
        got = matmul(da, db);
        sum(mul(got, up.to(dev))).backward();
      }
      Tensor ra = rounded(a.to(dev)).detach(), rb = rounded(b.to(dev)).detach();
      ra.set_requires_grad(true);
      rb.set_requires_grad(true);
      Tensor want = matmul(ra, rb);
      CHECK(same_bits(got, want));
      CHECK_FALSE(same_bits(got, matmul(a.to(dev), b.to(dev))));  // fp32 differs: the rounding is there
      // The fp32 gradients of the rounded inputs under the rounded upstream
      // gradient, by the same backward (outside an exact step the library's
      // GEMM, whose order the forward's fixed-order product need not share:
      // on a Zen core they differ).
      const Tensor g = rounded(up.to(dev));
      sum(mul(want, g)).backward();
      CHECK(same_bits(da.grad(), ra.grad()));
      CHECK(same_bits(db.grad(), rb.grad()));
      // conv1d (the columnless kernels): forward and input gradient.
      Tensor dx = x.to(dev).detach();
      dx.set_requires_grad(true);
      Tensor y;
      {
        PrecisionScope scope(p);
        y = conv1d(dx, w.to(dev), bias.to(dev));
        sum(mul(y, gy.to(dev))).backward();
      }
      Tensor rx = rounded(x.to(dev)).detach();
      rx.set_requires_grad(true);
      Tensor y_want = conv1d(rx, rounded(w.to(dev)), bias.to(dev));
      CHECK(same_bits(y, y_want));
      // The input gradient of the fp32 convolution of the rounded inputs
      // under the rounded upstream gradient.
      Tensor gy_r = rounded(gy.to(dev));
      sum(mul(y_want, gy_r)).backward();
      CHECK(same_bits(dx.grad(), rx.grad()));
    }
}

TEST_CASE("in an exact step, a weight's unit partials in tf32 are fp32's of the rounded inputs and upstream gradient") {
  // The weight's gradient of a batched product comes as unit partials
  // (engine/exact_batch.h), through kernels of its own: they take the
  // rounded inputs too. One unit of all rows; the reducer returns its partial.
  Generator gen(6, 0);
  const Tensor a = rand_normal({7, 33}, gen), b = rand_normal({33, 9}, gen), up = rand_normal({7, 9}, gen);
  auto weight_grad = [&](const Tensor& x, const Tensor& w0, const Tensor& g, Precision p) {
    ExactBatch batch;
    batch.unit_examples = {7};
    batch.rank_units = {1};
    batch.reduce = [](const std::vector<Tensor>& partials) {
      std::vector<Tensor> sums;
      for (const Tensor& t : partials) {
        Shape shape(t.shape().begin() + 1, t.shape().end());
        sums.push_back(reshape(t, shape).clone());
      }
      return sums;
    };
    ExactBatchScope exact(batch);
    PrecisionScope scope(p);
    Tensor w = w0.detach().clone();
    w.set_requires_grad(true);
    sum(mul(matmul(x, w), g)).backward();
    return w.grad();
  };
  for (Precision p : {Precision::tf32, Precision::bf16}) {
    CAPTURE(precision_name(p));
    auto rounded = [&](const Tensor& t) { return p == Precision::tf32 ? to_tf32(t) : to_bf16(t); };
    CHECK(same_bits(weight_grad(a, b, up, p), weight_grad(rounded(a), rounded(b), rounded(up), Precision::fp32)));
    CHECK_FALSE(same_bits(weight_grad(a, b, up, p), weight_grad(a, b, up, Precision::fp32)));
  }
}

TEST_CASE("precision names: fp32, tf32, bf16; another is refused by name; fp32 leaves a product's inputs as they are") {
  CHECK(parse_precision("tf32", "run.precision") == Precision::tf32);
  CHECK(std::string(precision_name(parse_precision("bf16", "x"))) == "bf16");
  CHECK_THROWS_WITH_AS(parse_precision("fp16", "run.precision"),
                       doctest::Contains("run.precision: unknown precision 'fp16'"), std::exception);
  CHECK(product_precision() == Precision::fp32);
  Tensor t = from_vector({1.f + 0x1p-12f}, {1});
  CHECK(product_input(t).raw_ptr() == t.raw_ptr());
  {
    PrecisionScope scope(Precision::tf32);
    CHECK(product_input(t).item() == 1.f);
    {
      PrecisionScope inner(Precision::fp32);
      CHECK(product_precision() == Precision::fp32);
    }
    CHECK(product_precision() == Precision::tf32);
  }
  CHECK(product_precision() == Precision::fp32);
}
