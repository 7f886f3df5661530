// SimVQ and ResidualSimVQ: the implicit codebook C W^T, nearest codes, the two-sided
// commitment loss, and W as the only state a step changes (by gradient).
// W ranks against 1 rank: the factory traces (test_quantizer.cpp) and
// check-ddp over examples/fashion_simvq.json (the train suite).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "comm/single.h"
#include "engine/autograd.h"
#include "tests/vq/harness.h"
#include "vq/assign.h"
#include "vq/index_columns.h"
#include "vq/residual_sim_vq.h"
#include "vq/sim_vq.h"

using namespace vqddp;
using namespace vqddp::test;

namespace {

SimVQOptions small(bool rotation) {
  SimVQOptions o;
  o.dim = 4;
  o.codebook_size = 16;
  o.frozen_codebook_dim = 3;
  o.rotation_trick = rotation;
  o.commitment_weight = 2.f;
  return o;
}

}  // namespace

TEST_CASE("SimVQ: codes are C W^T; each row takes its nearest code; the loss is the two-sided commitment") {
  SingleCommunicator comm;
  Generator init(0, 0), data(1, 0);
  SimVQ vq(small(/*rotation=*/false), init);
  // vector-quantize-pytorch's state names.
  Tensor frozen = named(vq.named_buffers(), "frozen_codebook"), weight = named(vq.named_parameters(), "code_transform.weight");
  CHECK(frozen.shape() == Shape{16, 3});
  CHECK(weight.shape() == Shape{4, 3});
  const std::vector<float> c = frozen.to_vector<float>(), w = weight.to_vector<float>();
  Tensor x = rand_normal({9, 4}, data);
  x.set_requires_grad(true);
  QuantizerOutput out = vq.quantize(x, comm);
  // Codes and nearest codes, in double on the host.
  std::vector<double> codes(16 * 4, 0.0);
  for (int k = 0; k < 16; ++k)
    for (int d = 0; d < 4; ++d)
      for (int f = 0; f < 3; ++f) codes[k * 4 + d] += double(c[k * 3 + f]) * w[d * 3 + f];
  const std::vector<float> xs = x.to_vector<float>();
  const std::vector<int64_t> idx = out.indices.to_vector<int64_t>();
  REQUIRE(out.indices.shape() == Shape{9, 1});
  double sq = 0;
  for (int n = 0; n < 9; ++n) {
    double best = std::numeric_limits<double>::infinity(), chosen = 0;
    for (int k = 0; k < 16; ++k) {
      double dist = 0;
      for (int d = 0; d < 4; ++d) dist += std::pow(xs[n * 4 + d] - codes[k * 4 + d], 2);
      best = std::min(best, dist);
      if (k == idx[n]) chosen = dist;
    }
    CHECK(chosen == doctest::Approx(best).epsilon(1e-5));
    sq += chosen;
  }
  // loss = 2 * (mse + 0.25 mse): both terms have the same value.
  CHECK(out.loss.item<float>() == doctest::Approx(2.0 * 1.25 * sq / 36).epsilon(1e-5));
  // Straight-through: the output is the codes' values with the identity
  // gradient; W's gradient comes from the loss alone.
  sum(out.quantized).backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>(36, 1.f));
  CHECK_FALSE(weight.grad().defined());
  out.loss.backward();
  CHECK(sum(square(weight.grad())).item<float>() > 0);
  check_close({{"decoded", vq.decode(out.indices)}}, {{"decoded", out.quantized.detach()}}, 1e-5, 1e-6);
}

TEST_CASE("SimVQ: the rotation trick (its default) shapes the input gradient; inference issues no collective") {
  SingleCommunicator comm;
  Generator init(0, 0), data(1, 0);
  SimVQ vq(small(/*rotation=*/true), init);
  Tensor x = rand_normal({9, 4}, data);
  x.set_requires_grad(true);
  QuantizerOutput out = vq.quantize(x, comm);
  sum(out.quantized).backward();
  CHECK(x.grad().to_vector<float>() != std::vector<float>(36, 1.f));
  check_close({{"value", vq.decode(out.indices)}}, {{"value", out.quantized.detach()}}, 1e-5, 1e-5);
  vq.eval();
  const uint64_t before = comm.counters().collectives;
  vq.quantize(x.detach(), comm);
  CHECK(comm.counters().collectives == before);
}

TEST_CASE("ResidualSimVQ: SimVQ layers on the residual under the reference's state names; decode is the eval output") {
  SingleCommunicator comm;
  Generator init(0, 0), data(1, 0);
  ResidualSimVQOptions o;
  o.layer = small(/*rotation=*/true);
  o.num_quantizers = 3;
  ResidualSimVQ rvq(o, init);
  for (int i = 0; i < 3; ++i) {
    CHECK(named(rvq.named_buffers(), "layers." + std::to_string(i) + ".frozen_codebook").shape() == Shape{16, 3});
    CHECK(named(rvq.named_parameters(), "layers." + std::to_string(i) + ".code_transform.weight").shape() == Shape{4, 3});
  }
  Tensor x = rand_normal({9, 4}, data);
  rvq.eval();
  QuantizerOutput out = rvq.quantize(x, comm);
  REQUIRE(out.indices.shape() == Shape{9, 3});
  CHECK(out.layer_losses.size() == 3);
  check_close({{"decoded", rvq.decode(out.indices)}}, {{"decoded", out.quantized}}, 1e-5, 1e-6);
  // Each layer quantizes what the layers before it left.
  std::vector<Tensor> columns = split_columns(out.indices);
  Tensor first = rvq.layer(0).decode(columns[0]);
  Tensor second = assign_codes(sub(x, first), rvq.layer(1).codes().detach(), /*cosine=*/false);
  CHECK(second.to_vector<int64_t>() == columns[1].to_vector<int64_t>());
}
