// FSQ (round trips, level sets, straight-through, no collective) and LFQ
// (bits, entropy gradient with W ranks equal to one rank).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "comm/single.h"
#include "engine/autograd.h"
#include "tests/vq/harness.h"
#include "vq/fsq.h"
#include "vq/lfq.h"
#include "vq/residual_fsq.h"

using namespace vqddp;
using namespace vqddp::test;

TEST_CASE("FSQ: the recommended level sets give codebook sizes 240, 1000, 4375, 15360, 64000") {
  CHECK(fsq_codebook_size({8, 6, 5}) == 240);
  CHECK(fsq_codebook_size({8, 5, 5, 5}) == 1000);
  CHECK(fsq_codebook_size({7, 5, 5, 5, 5}) == 4375);
  CHECK(fsq_codebook_size({8, 8, 8, 6, 5}) == 15360);
  CHECK(fsq_codebook_size({8, 8, 8, 5, 5, 5}) == 64000);
}

TEST_CASE("FSQ: every index round-trips through its code, and quantize maps codes to themselves") {
  Generator init(0, 0);
  for (std::vector<int> levels : {std::vector<int>{8, 6, 5}, std::vector<int>{8, 5, 5, 5}, std::vector<int>{7, 5, 5, 5, 5}}) {
    FSQ fsq({levels}, init);
    Tensor all = arange(fsq.codebook_size());
    Tensor codes = fsq.indices_to_codes(all);
    CHECK(fsq.codes_to_indices(codes).to_vector<int64_t>() == all.to_vector<int64_t>());
    for (float c : codes.to_vector<float>()) CHECK((c >= -1.f && c <= 1.f));
  }
}

TEST_CASE("FSQ: any input lands on a valid code whose index round-trips; gradients pass straight through") {
  Generator init(0, 0), data(1, 0);
  SingleCommunicator comm;
  FSQ fsq({{8, 5, 5, 5}}, init);
  Tensor x = mul(rand_normal({500, 4}, data), 3.f);
  x.set_requires_grad(true);
  QuantizerOutput out = fsq.quantize(x, comm);
  for (int64_t i : out.indices.to_vector<int64_t>()) CHECK((i >= 0 && i < 1000));
  check_close({{"codes", fsq.indices_to_codes(out.indices)}}, {{"codes", out.quantized}}, 0, 1e-6);
  // d quantized / d x = d bound / d x (round is straight-through): tanh' * half_l / (L // 2).
  sum(out.quantized).backward();
  const float* g = x.grad().data<float>();
  const float* px = x.data<float>();
  int levels[4] = {8, 5, 5, 5};
  for (int64_t i = 0; i < 40; ++i) {
    int l = levels[i % 4];
    double h = (l - 1) * (1 + 1e-3) / 2, off = l % 2 == 0 ? 0.5 : 0.0, shift = std::atanh(off / h);
    double t = std::tanh(px[i] + shift);
    CHECK(g[i] == doctest::Approx((1 - t * t) * h / (l / 2)).epsilon(1e-4));
  }
}

TEST_CASE("FSQ preserve_symmetry with a hard clamp: L codes over [-1, 1], ends included, the clamp's gradient") {
  Generator init(0, 0);
  SingleCommunicator comm;
  FSQOptions o{{8, 5}};
  o.preserve_symmetry = true;
  o.bound_hard_clamp = true;
  FSQ fsq(o, init);
  // Per dimension: code = 2/(L-1) * floor((L-1)(clamp(z)+1)/2 + 0.5) - 1; digit = the floor.
  std::vector<float> z = {0.f, 0.f, 1.f, 1.f, -1.f, -1.f, 2.f, -3.f, 0.3f, 0.3f};
  Tensor x = from_vector(z, {5, 2});
  x.set_requires_grad(true);
  QuantizerOutput out = fsq.quantize(x, comm);
  std::vector<float> q = out.quantized.to_vector<float>();
  std::vector<int64_t> idx = out.indices.to_vector<int64_t>();
  for (int64_t r = 0; r < 5; ++r) {
    int64_t index = 0, place = 1;
    for (int j = 0; j < 2; ++j) {
      const int l = j == 0 ? 8 : 5;
      const float t = std::clamp(z[r * 2 + j], -1.f, 1.f);
      const float bracket = std::floor(static_cast<float>(l - 1) * (t + 1.f) / 2.f + 0.5f);
      CHECK(q[r * 2 + j] == 2.f / static_cast<float>(l - 1) * bracket - 1.f);
      index += static_cast<int64_t>(bracket) * place;
      place *= l;
    }
    CHECK(idx[r] == index);
  }
  CHECK(q[4] == -1.f);  // the ends are codes
  CHECK(q[2] == 1.f);
  // Straight-through floor: the gradient is the clamp's, 1 inside [-1, 1] (ends included), 0 outside.
  sum(out.quantized).backward();
  std::vector<float> g = x.grad().to_vector<float>();
  for (size_t i = 0; i < z.size(); ++i) CHECK(g[i] == (std::fabs(z[i]) <= 1.f ? 1.f : 0.f));
  Tensor all = arange(fsq.codebook_size());
  CHECK(fsq.codes_to_indices(fsq.indices_to_codes(all)).to_vector<int64_t>() == all.to_vector<int64_t>());
}

TEST_CASE("ResidualFSQ soft-clamps once, then quantizes each layer with symmetric hard-clamped FSQ") {
  Generator init(0, 0), data(3, 0);
  SingleCommunicator comm;
  ResidualFSQOptions o;
  o.levels = {8, 5, 5, 5};
  o.num_quantizers = 3;
  ResidualFSQ rfsq(o, init);
  Tensor x = mul(rand_normal({64, 4}, data), 2.f);
  QuantizerOutput out = rfsq.quantize(x, comm);
  // The first layer's digit from the closed form: c = 1 + 1/(L-1), z = tanh(x/c)*c.
  std::vector<float> px = x.to_vector<float>();
  std::vector<int64_t> idx = out.indices.to_vector<int64_t>();
  for (int64_t r = 0; r < 64; ++r) {
    int64_t index = 0, place = 1;
    for (int j = 0; j < 4; ++j) {
      const int l = o.levels[j];
      const float c = 1.f + 1.f / static_cast<float>(l - 1);
      const float zc = std::tanh(px[r * 4 + j] / c) * c;
      const float t = std::clamp(zc, -1.f, 1.f);
      index += static_cast<int64_t>(std::floor(static_cast<float>(l - 1) * (t + 1.f) / 2.f + 0.5f)) * place;
      place *= l;
    }
    CHECK(idx[r * 3] == index);
  }
  // The layers together get within the last layer's half step: |z - q| <= 1/(L-1) * L^-2.
  std::vector<float> q = out.quantized.to_vector<float>();
  for (int64_t i = 0; i < 64 * 4; ++i) {
    const int l = o.levels[i % 4];
    const float c = 1.f + 1.f / static_cast<float>(l - 1);
    const float zc = std::tanh(px[i] / c) * c;
    CHECK(std::fabs(zc - q[i]) <= 1.0001f / static_cast<float>((l - 1) * l * l));
  }
}

TEST_CASE("FSQ refuses non-finite input instead of inventing an index, also in inference") {
  SingleCommunicator comm;
  Generator init(0, 0);
  FSQ fsq({{8, 5, 5, 5}}, init);
  fsq.eval();  // the local check (a training step checks every rank alike first: the next case)
  Tensor x = zeros({3, 4});
  x.data<float>()[2 * 4 + 1] = std::nanf("");
  CHECK_THROWS_WITH_AS(fsq.quantize(x, comm), doctest::Contains("FSQ: row 2 has a non-finite value (nan in column 1)"), Error);
}

TEST_CASE("FSQ and ResidualFSQ: a non-finite row on one rank stops every rank alike, naming rank, row and column") {
  for (bool residual : {false, true}) {
    CAPTURE(residual);
    std::vector<std::string> seen(3);
    run_ranks(3, [&](Communicator& comm) {
      Generator init(0, 0);
      Tensor x = zeros({4, 4});
      if (comm.rank() == 1) x.data<float>()[2 * 4 + 1] = std::nanf("");
      try {
        if (residual) {
          ResidualFSQOptions o;
          o.levels = {8, 5, 5, 5};
          o.num_quantizers = 2;
          ResidualFSQ q(o, init);
          q.quantize(x, comm, Tensor());
        } else {
          FSQ q({{8, 5, 5, 5}}, init);
          q.quantize(x, comm, Tensor());
        }
      } catch (const NonFiniteError& e) {
        seen[comm.rank()] = e.what();  // caught: no rank aborts the others
      }
    }, kFast);
    std::string name = residual ? "ResidualFSQ" : "FSQ";
    for (int r = 0; r < 3; ++r)
      CHECK(seen[r].find("rank 1: row 2 of " + name + "'s input has a non-finite value (in column 1)") !=
            std::string::npos);
  }
}

TEST_CASE("FSQ with projections and several codebooks; decode equals the output") {
  Generator init(0, 0), data(2, 0);
  SingleCommunicator comm;
  FSQ fsq({{8, 6, 5}, 10, 2}, init);
  Tensor x = rand_normal({7, 10}, data);
  QuantizerOutput out = fsq.quantize(x, comm);
  CHECK(out.indices.shape() == Shape{7, 2});
  CHECK(out.quantized.shape() == Shape{7, 10});
  check_close({{"d", fsq.decode(out.indices)}}, {{"d", out.quantized}}, 1e-5, 1e-6);
}

TEST_CASE("LFQ: signs become bits, first dimension most significant") {
  SingleCommunicator comm;
  Generator init(0, 0);
  LFQ lfq({0, 8}, init);
  lfq.eval();
  QuantizerOutput out = lfq.quantize(from_vector({0.5f, -1.f, 2.f, -0.1f, -0.2f, 0.3f}, {2, 3}), comm);
  CHECK(out.indices.to_vector<int64_t>() == std::vector<int64_t>{0b101, 0b001});
  CHECK(out.quantized.to_vector<float>() == std::vector<float>{1, -1, 1, -1, -1, 1});
  CHECK(lfq.decode(out.indices).to_vector<float>() == out.quantized.to_vector<float>());
  CHECK(comm.counters().collectives == 0);
  CHECK(out.loss.item<float>() == 0.f);
}

TEST_CASE("LFQ: the entropy loss gradient with W ranks (uneven, one empty) equals one rank on the whole batch") {
  Generator data(3, 0);
  Tensor x = mul(rand_normal({13, 4}, data), 0.1f);  // logits within +-8: soft but far from uniform
  LFQOptions o{0, 16};
  o.commitment_weight = 0.f;  // the entropy term alone
  o.entropy_loss_weight = 1.f;
  o.inv_temperature = 10.f;
  Tensor reference;
  float reference_loss = 0;
  run_ranks(1, [&](Communicator& comm) {
    Generator init(0, 0);
    LFQ lfq(o, init);
    Tensor xr = x.clone();
    xr.set_requires_grad(true);
    QuantizerOutput out = lfq.quantize(xr, comm);
    out.loss.backward();
    reference = xr.grad();
    reference_loss = out.loss.item<float>();
  }, kFast);
  CHECK(sum(square(reference)).item<float>() > 1e-4f);
  MESSAGE("LFQ reference gradient norm^2 ", sum(square(reference)).item<float>());
  for (int w : {2, 3}) {
    CAPTURE(w);
    // Rows split unevenly, with an empty rank when W = 3.
    std::vector<int64_t> sizes = w == 2 ? std::vector<int64_t>{4, 9} : std::vector<int64_t>{0, 5, 8};
    std::vector<Tensor> grads(w);
    run_ranks(w, [&](Communicator& comm) {
      Generator init(0, 0);
      LFQ lfq(o, init);
      Tensor xr = shard(x, sizes, comm.rank()).clone();
      xr.set_requires_grad(true);
      QuantizerOutput out = lfq.quantize(xr, comm);
      // Each rank backpropagates its share of the global loss: N_r / N.
      mul(out.loss, static_cast<float>(sizes[comm.rank()]) / 13.f).backward();
      grads[comm.rank()] = xr.grad().defined() ? xr.grad() : zeros(xr.shape());
      // The codebook term is the global one on every rank.
      CHECK(out.extra("codebook_entropy").item<float>() > 0);
    }, kFast);
    check_close({{"grad", concat(grads, 0)}}, {{"grad", reference}}, 1e-3, 1e-6);
  }
  CHECK(reference_loss < 0);  // the codebook entropy dominates at this temperature
}
