// An exact step's unit partials (engine/exact_batch.h) for a weight and a
// bias: batched over the units (one launch per weight, ops_matmul.cpp and
// exact_batch.cpp), each unit's partial must be the bits of that unit's own
// product and sum, for equal units and for uneven ones (runs of equal units).
#include <doctest/doctest.h>

#include <cmath>

#include "engine/autograd.h"
#include "engine/device_counters.h"
#include "engine/exact_batch.h"
#include "engine/ops.h"
#include "tests/engine/same_bits.h"

using namespace vqddp;
using namespace vqddp::test;

namespace {

Tensor values(int64_t rows, int64_t cols, float phase, Device device) {
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37f * static_cast<float>(i) + phase) * 1.7f;
  return to_device(from_vector(v, {rows, cols}), device);
}

// An exact step of one rank with these units, whose reducer keeps the unit
// partials it is handed in `partials` and sums them over the units.
ExactBatch one_rank_batch(const std::vector<int64_t>& units, std::vector<Tensor>& partials) {
  ExactBatch batch;
  batch.unit_examples = units;
  batch.rank_units = {static_cast<int64_t>(units.size())};
  batch.reduce = [&partials](const std::vector<Tensor>& p) {
    partials = p;
    std::vector<Tensor> sums;
    for (const Tensor& t : p) sums.push_back(sum(t, 0));
    return sums;
  };
  return batch;
}

}  // namespace

TEST_CASE("exact step: batched unit partials of a weight and a bias equal each unit's own product and sum") {
  const int64_t rows_per_example = 3, d = 5, n = 4;
  for (Device device : {Device::cpu(), Device::sim()}) {
    for (std::vector<int64_t> units : {std::vector<int64_t>{1, 1, 1, 1}, {2, 1, 1, 3}, {1}}) {
      CAPTURE(device.str());
      CAPTURE(units.size());
      int64_t examples = 0;
      for (int64_t u : units) examples += u;
      const int64_t rows = examples * rows_per_example;
      Tensor x = values(rows, d, 0.1f, device);
      Tensor c = values(rows, n, 0.7f, device);  // d loss / d y
      Tensor w = values(d, n, 0.3f, device).set_requires_grad(true);
      Tensor b = values(1, n, 0.9f, device).reshape({n}).detach().set_requires_grad(true);
      std::vector<Tensor> partials;
      ExactBatch batch = one_rank_batch(units, partials);
      reset_device_counters();
      {
        ExactBatchScope scope(batch);
        sum(mul(add(matmul(x, w), b), c)).backward();
      }
      REQUIRE(partials.size() == 2);
      const Tensor& pw = partials[0].dim() == 3 ? partials[0] : partials[1];
      const Tensor& pb = partials[0].dim() == 3 ? partials[1] : partials[0];
      int64_t lo = 0;
      for (size_t u = 0; u < units.size(); ++u) {
        int64_t hi = lo + units[u] * rows_per_example;
        Tensor xu = x.slice_rows(lo, hi), cu = c.slice_rows(lo, hi);
        CHECK(same_bits(pw.slice_rows(u, u + 1).reshape({d, n}), matmul(xu, cu, true)));
        CHECK(same_bits(pb.slice_rows(u, u + 1).reshape({n}), sum_to_shape(cu, {n})));
        lo = hi;
      }
    }
  }
}

TEST_CASE("exact step: conv2d's product in the image layout gives the row product's bits: output, input gradient "
          "and weight partials, for single-example units (its batched path) and longer ones (the row path)") {
  const int64_t c = 3, cout = 4, h = 5, w = 9, kh = 2, kw = 3;
  ConvOptions o;
  o.stride = {1, 2};
  o.padding = {1, 1};
  for (Device device : {Device::cpu(), Device::sim()}) {
    for (std::vector<int64_t> units : {std::vector<int64_t>{1, 1, 1}, {2, 1}}) {
      CAPTURE(device.str());
      CAPTURE(units.size());
      const int64_t n = 3;
      // What a step gives: y, x's gradient and the weight's unit partials.
      auto step = [&](bool rows_path) {
        Tensor x = requires_input_grad(values(n, c * h * w, 0.2f, device).reshape({n, c, h, w}).detach());
        Tensor weight = values(cout, c * kh * kw, 0.5f, device).reshape({cout, c, kh, kw}).detach().set_requires_grad(true);
        std::vector<Tensor> partials;
        ExactBatch batch = one_rank_batch(units, partials);
        Tensor y;
        {
          ExactBatchScope scope(batch);
          if (rows_path) {
            // The row product and its transpose to the image layout.
            Tensor cols = unfold(x, kh, kw, o);
            Tensor rows = matmul(cols, reshape(weight, {cout, c * kh * kw}), false, true);
            int64_t positions = rows.size(0) / n;
            y = transpose(reshape(rows, {n, positions, cout}), 1, 2);
          } else {
            y = conv2d(x, weight, Tensor(), o);
          }
          y = reshape(y, {n, -1});
          sum(square(y)).backward();
        }
        REQUIRE(partials.size() == 1);
        return std::vector<Tensor>{y.detach(), x.grad(), partials[0].reshape({static_cast<int64_t>(units.size()), -1})};
      };
      std::vector<Tensor> image = step(false), rows = step(true);
      CHECK(same_bits(image[0], rows[0]));
      CHECK(same_bits(image[1], rows[1]));
      CHECK(same_bits(image[2], rows[2]));
    }
  }
}
