// VectorQuantize: projections, heads, masks, losses, straight-through,
// learnable codebooks, decode.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "comm/single.h"
#include "engine/autograd.h"
#include "tests/vq/harness.h"
#include "vq/assign.h"
#include "vq/quantizer_options.h"
#include "vq/residual_vq.h"
#include "vq/rotation_trick.h"
#include "vq/orthogonal_reg.h"
#include "vq/quantizer_options.h"
#include "vq/vector_quantize.h"

using namespace vqddp;
using namespace vqddp::test;

namespace {
VectorQuantizeOptions base(int64_t dim, int heads = 1) {
  VectorQuantizeOptions o;
  o.dim = dim;
  o.codebook_size = 8;
  o.heads = heads;
  o.commitment_weight = 0.5f;
  o.codebook.kmeans_iters = 3;
  o.codebook.threshold_ema_dead_code = 0;
  return o;
}
}  // namespace

TEST_CASE("straight-through: the output has the codes' values and the identity gradient") {
  SingleCommunicator comm;
  Generator init(0, 0), data(1, 0);
  VectorQuantizeOptions o = base(4);
  o.rotation_trick = false;
  VectorQuantize vq(o, init);
  Tensor x = rand_normal({10, 4}, data);
  x.set_requires_grad(true);
  QuantizerOutput out = vq.quantize(x, comm);
  sum(out.quantized).backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>(40, 1.f));
  CHECK(out.indices.shape() == Shape{10, 1});  // one column per head
  CHECK(out.metrics.size() == 1);
}

TEST_CASE("rotation trick: the output has the codes' values, the gradient is the scaled rotation of the input onto its code") {
  SingleCommunicator comm;
  Generator init(0, 0), data(1, 0), upstream(2, 0);
  VectorQuantizeOptions o = base(4);
  // A learnable codebook without k-means: quantize() leaves the codes as
  // they are, so the codes looked up after the step are the step's.
  o.codebook.learnable = true;
  o.codebook.kmeans_init = false;
  VectorQuantize vq(o, init);
  REQUIRE(vq.options().rotation_trick);  // on by default, as in vector-quantize-pytorch
  const int64_t n = 10, d = 4;
  Tensor x = rand_normal({n, d}, data);
  x.set_requires_grad(true);
  QuantizerOutput out = vq.quantize(x, comm);
  Tensor g = rand_normal({n, d}, upstream);
  sum(mul(out.quantized, g)).backward();
  Tensor codes = vq.codebooks()[0]->lookup(reshape(out.indices, {-1}));
  // The forward value is the code, up to the rotation's rounding.
  check_close({{"value", out.quantized}}, {{"value", codes}}, 1e-5, 1e-5);
  // d out / d e = (I - 2 w w^T + 2 q^ u^T) |q| / |e|: its transpose applied
  // to g, in double, row by row.
  const float *pe = x.data<float>(), *pq = codes.data<float>(), *pg = g.data<float>(), *pgrad = x.grad().data<float>();
  double largest_change = 0;
  for (int64_t r = 0; r < n; ++r) {
    double ne = 0, nq = 0;
    for (int64_t j = 0; j < d; ++j) ne += double(pe[r * d + j]) * pe[r * d + j], nq += double(pq[r * d + j]) * pq[r * d + j];
    ne = std::sqrt(ne), nq = std::sqrt(nq);
    std::vector<double> u(d), qh(d), w(d);
    double nw = 0;
    for (int64_t j = 0; j < d; ++j) u[j] = pe[r * d + j] / ne, qh[j] = pq[r * d + j] / nq, nw += (u[j] + qh[j]) * (u[j] + qh[j]);
    for (int64_t j = 0; j < d; ++j) w[j] = (u[j] + qh[j]) / std::sqrt(nw);
    double gw = 0, gq = 0;
    for (int64_t j = 0; j < d; ++j) gw += pg[r * d + j] * w[j], gq += pg[r * d + j] * qh[j];
    for (int64_t j = 0; j < d; ++j) {
      double want = (pg[r * d + j] - 2 * gw * w[j] + 2 * gq * u[j]) * nq / ne;
      CHECK(pgrad[r * d + j] == doctest::Approx(want).epsilon(1e-4).scale(1e-6));
      largest_change = std::max(largest_change, std::fabs(want - pg[r * d + j]));
    }
  }
  CHECK(largest_change > 0.1);  // not the straight-through gradient
  // Inference is the code, no rotation (nothing to rotate a gradient for).
  vq.eval();
  QuantizerOutput ev = vq.quantize(x.detach(), comm);
  check_close({{"eval", ev.quantized}}, {{"eval", vq.decode(ev.indices)}}, 0, 1e-6);
}

TEST_CASE("rotation trick with heads: each head's piece is rotated onto its own code") {
  SingleCommunicator comm;
  Generator init(0, 0), data(1, 0), upstream(2, 0);
  VectorQuantizeOptions o = base(8, /*heads=*/2);
  // A learnable codebook without k-means: quantize() leaves the codes as
  // they are, so the codes looked up after the step are the step's.
  o.codebook.learnable = true;
  o.codebook.kmeans_init = false;
  VectorQuantize vq(o, init);
  Tensor x = rand_normal({6, 8}, data), g = rand_normal({6, 8}, upstream);
  x.set_requires_grad(true);
  QuantizerOutput out = vq.quantize(x, comm);
  sum(mul(out.quantized, g)).backward();
  // The same rows as (12, 4) head pieces through rotate_to directly.
  Tensor pieces = reshape(x.detach(), {12, 4});
  pieces.set_requires_grad(true);
  Tensor codes = vq.codebooks()[0]->lookup(reshape(out.indices, {-1}));  // (12, 4), row n*2 + head
  sum(mul(rotate_to(pieces, codes), reshape(g, {12, 4}))).backward();
  CHECK(x.grad().to_vector<float>() == pieces.grad().to_vector<float>());
}

namespace {
// The codes the rows meet are the initial ones (no k-means init).
VectorQuantizeOptions initial_codes() {
  VectorQuantizeOptions o = base(4);
  o.codebook.kmeans_init = false;
  return o;
}

VectorQuantizeOptions diversity_options() {
  VectorQuantizeOptions o = initial_codes();
  o.commitment_weight = 0.f;       // the diversity loss alone
  o.codebook_diversity_loss_weight = 1.f;
  o.codebook_diversity_temperature = 2.f;  // soft enough for a gradient everywhere
  return o;
}
}  // namespace

TEST_CASE("codebook diversity loss: minus the entropy of the average code probability, from the codes before the update") {
  SingleCommunicator comm;
  Generator init(0, 0), data(1, 0);
  VectorQuantize vq(diversity_options(), init);
  const std::vector<float> e = vq.codebooks()[0]->embed.to_vector<float>();  // (8, 4), before the step
  Tensor x = rand_normal({10, 4}, data);
  QuantizerOutput out = vq.quantize(x, comm);
  const std::vector<float> xs = x.to_vector<float>();
  std::vector<double> avg(8, 0.0);
  for (int n = 0; n < 10; ++n) {
    std::vector<double> s(8);
    double top = -1e300, z = 0;
    for (int k = 0; k < 8; ++k) {
      double d2 = 0;
      for (int j = 0; j < 4; ++j) d2 += std::pow(double(xs[n * 4 + j]) - e[k * 4 + j], 2);
      s[k] = -2.0 * std::sqrt(d2);
      top = std::max(top, s[k]);
    }
    for (int k = 0; k < 8; ++k) z += std::exp(s[k] - top);
    for (int k = 0; k < 8; ++k) avg[k] += std::exp(s[k] - top) / z / 10;
  }
  double h = 0;
  for (double p : avg) h -= p * std::log(std::max(p, 1e-5));
  CHECK(out.extra("codebook_diversity_loss").item<float>() == doctest::Approx(-h).epsilon(1e-5));
  CHECK(out.loss.item<float>() == doctest::Approx(-h).epsilon(1e-5));
  vq.eval();  // inference: no loss term, no collective
  const uint64_t before = comm.counters().collectives;
  CHECK(vq.quantize(x, comm).extra("codebook_diversity_loss").item<float>() == 0.f);
  CHECK(comm.counters().collectives == before);
}

TEST_CASE("commitment_use_cross_entropy_loss: the commitment term is the weighted mean cross entropy of each row's "
          "logits (minus the distance) against its code") {
  SingleCommunicator comm;
  Generator init(0, 0), data(1, 0);
  VectorQuantizeOptions o = initial_codes();
  o.commitment_weight = 0.5f;
  o.commitment_use_cross_entropy_loss = true;
  VectorQuantize vq(o, init);
  const std::vector<float> e = vq.codebooks()[0]->embed.to_vector<float>();  // (8, 4), before the step
  Tensor x = rand_normal({10, 4}, data);
  QuantizerOutput out = vq.quantize(x, comm);
  const std::vector<float> xs = x.to_vector<float>();
  const std::vector<int64_t> idx = out.indices.to_vector<int64_t>();
  double ce = 0;
  for (int n = 0; n < 10; ++n) {
    std::vector<double> s(8);
    double top = -1e300, z = 0;
    for (int k = 0; k < 8; ++k) {
      double d2 = 0;
      for (int j = 0; j < 4; ++j) d2 += std::pow(double(xs[n * 4 + j]) - e[k * 4 + j], 2);
      s[k] = -std::sqrt(d2);
      top = std::max(top, s[k]);
    }
    for (int k = 0; k < 8; ++k) z += std::exp(s[k] - top);
    ce += (std::log(z) + top - s[idx[n]]) / 10;
  }
  CHECK(out.loss.item<float>() == doctest::Approx(0.5 * ce).epsilon(1e-5));
}

TEST_CASE("orthogonal regulariser: sum of squared cosines over n^2 minus 1/n; 0 for orthogonal codes, 1/2 for two "
          "equal ones; only on learnable codebooks, added with its weight") {
  CHECK(orthogonal_loss(from_vector({1, 0, 0, 0, 2, 0, 0, 0, -3}, {3, 3})).item<float>() == doctest::Approx(0.f).scale(1));
  CHECK(orthogonal_loss(from_vector({1, 2, 2, 4}, {2, 2})).item<float>() == doctest::Approx(0.5f));
  SingleCommunicator comm;
  Generator init(0, 0), data(1, 0);
  VectorQuantizeOptions o = initial_codes();
  o.codebook.learnable = true;
  o.commitment_weight = 0.f;
  o.orthogonal_reg_weight = 2.f;
  VectorQuantize vq(o, init);
  QuantizerOutput out = vq.quantize(rand_normal({10, 4}, data), comm);
  const float reg = orthogonal_loss(vq.codebooks()[0]->embed.detach()).item<float>();
  CHECK(out.extra("orthogonal_reg_loss").item<float>() == reg);
  out.loss.backward();
  CHECK(vq.codebooks()[0]->embed.grad().defined());
  QuantizerOptions bad = QuantizerOptions::of("vq");
  nlohmann::json j = {{"type", "vq"}, {"orthogonal_reg_weight", 1.0}};
  CHECK_THROWS_WITH_AS(read_quantizer_options(ConfigSection(j, "quantizer", "run.json"), bad),
                       doctest::Contains("'quantizer.orthogonal_reg_weight' needs \"learnable_codebook\": true"), Error);
}

TEST_CASE("ema_update false keeps the codes; with revival on the statistics still move and dead codes are still "
          "replaced, as the reference; sync_update_v scales the gradient through the output by 1 + v") {
  SingleCommunicator comm;
  for (float threshold : {0.f, 1.5f}) {
    CAPTURE(threshold);
    Generator init(0, 0), data(1, 0);
    VectorQuantizeOptions o = initial_codes();
    o.codebook.ema_update = false;
    o.codebook.threshold_ema_dead_code = threshold;
    VectorQuantize vq(o, init);
    const Codebook& book = *vq.codebooks()[0];
    const std::vector<float> e0 = book.embed.to_vector<float>(), c0 = book.cluster_size.to_vector<float>();
    QuantizerOutput out = vq.quantize(rand_normal({10, 4}, data), comm);
    const std::vector<float> e1 = book.embed.to_vector<float>(), c1 = book.cluster_size.to_vector<float>();
    const int64_t revived = out.metrics[0].codes_revived();
    int changed = 0;
    for (int k = 0; k < 8; ++k) changed += !std::equal(e0.begin() + k * 4, e0.begin() + k * 4 + 4, e1.begin() + k * 4);
    CHECK(changed == revived);  // only revived codes move
    CHECK((c0 != c1) == (threshold > 0));
    if (threshold > 0) CHECK(revived > 0);
  }
  auto input_grad = [&](float v) {
    Generator init(0, 0), data(1, 0);
    VectorQuantizeOptions o = initial_codes();
    o.codebook.learnable = true;
    o.rotation_trick = false;
    o.commitment_weight = 0.f;
    o.sync_update_v = v;
    VectorQuantize vq(o, init);
    Tensor x = rand_normal({6, 4}, data);
    x.set_requires_grad(true);
    QuantizerOutput out = vq.quantize(x, comm);
    sum(out.quantized).backward();
    return x.grad().to_vector<float>();
  };
  const std::vector<float> g0 = input_grad(0.f), g1 = input_grad(0.5f);
  for (size_t i = 0; i < g0.size(); ++i) CHECK(g1[i] == 1.5f * g0[i]);
}

TEST_CASE("in_place_codebook_optimizer: one SGD step on the codebook for mse(codes, x) inside the forward, then the "
          "rows assigned again") {
  SingleCommunicator comm;
  Generator init(0, 0), data(1, 0);
  VectorQuantizeOptions o = initial_codes();
  o.codebook.learnable = true;
  o.in_place_codebook_lr = 30.f;  // a step that overshoots: some rows change code
  VectorQuantize vq(o, init);
  Tensor& embed = vq.codebooks()[0]->embed;
  const std::vector<float> e0 = embed.to_vector<float>();
  Tensor x = rand_normal({10, 4}, data);
  const std::vector<float> xs = x.to_vector<float>();
  const std::vector<int64_t> first = assign_codes(x, embed.detach(), false).to_vector<int64_t>();
  QuantizerOutput out = vq.quantize(x, comm);
  std::vector<float> want = e0;
  for (int n = 0; n < 10; ++n)
    for (int j = 0; j < 4; ++j) {
      const int64_t k = first[n];
      want[k * 4 + j] -= 30.f * 2.f * (e0[k * 4 + j] - xs[n * 4 + j]) / 40.f;
    }
  const std::vector<float> e1 = embed.to_vector<float>();
  for (size_t i = 0; i < want.size(); ++i) CHECK(e1[i] == doctest::Approx(want[i]).epsilon(1e-5));
  // The output's codes are the stepped codebook's nearest, which are not
  // all the first assignment's (else this could not tell them apart).
  const std::vector<int64_t> got = out.indices.reshape({-1}).to_vector<int64_t>();
  CHECK(got == assign_codes(x, embed.detach(), false).to_vector<int64_t>());
  CHECK(got != first);
}

TEST_CASE("affine_param: the codes are used in the batch's space, (embed - cm) * bstd / cstd + bm, from the first "
          "step's moments of the batch and of the codebook") {
  SingleCommunicator comm;
  Generator init(0, 0), data(1, 0);
  VectorQuantizeOptions o = initial_codes();
  o.codebook.threshold_ema_dead_code = 0;
  o.codebook.affine_param = true;
  VectorQuantize vq(o, init);
  const Codebook& book = *vq.codebooks()[0];
  const std::vector<float> e = book.embed.to_vector<float>();  // (8, 4) before the step
  Tensor x = add(mul(rand_normal({10, 4}, data), 3.f), 5.f);     // far from the codes' scale
  const std::vector<float> xs = x.to_vector<float>();
  QuantizerOutput out = vq.quantize(x, comm);
  std::vector<double> bm(4, 0), bv(4, 0), cm(4, 0), cv(4, 0);
  for (int j = 0; j < 4; ++j) {
    for (int n = 0; n < 10; ++n) bm[j] += xs[n * 4 + j] / 10.0;
    for (int n = 0; n < 10; ++n) bv[j] += std::pow(xs[n * 4 + j] - bm[j], 2) / 10.0;
    for (int k = 0; k < 8; ++k) cm[j] += e[k * 4 + j] / 8.0;
    for (int k = 0; k < 8; ++k) cv[j] += std::pow(e[k * 4 + j] - cm[j], 2) / 8.0;
  }
  const std::vector<float> q = out.quantized.detach().to_vector<float>();
  const std::vector<int64_t> idx = out.indices.reshape({-1}).to_vector<int64_t>();
  for (int n = 0; n < 10; ++n) {
    double best = 1e300;
    int64_t want = -1;
    for (int k = 0; k < 8; ++k) {
      double d2 = 0;
      for (int j = 0; j < 4; ++j) {
        double c = (e[k * 4 + j] - cm[j]) * std::sqrt(bv[j]) / std::sqrt(cv[j]) + bm[j];
        d2 += std::pow(xs[n * 4 + j] - c, 2);
      }
      if (d2 < best) best = d2, want = k;
    }
    CHECK(idx[n] == want);
    for (int j = 0; j < 4; ++j)
      CHECK(q[n * 4 + j] ==
            doctest::Approx((e[want * 4 + j] - cm[j]) * std::sqrt(bv[j]) / std::sqrt(cv[j]) + bm[j]).epsilon(1e-4));
  }
}

TEST_CASE("codebook diversity loss: the average is the global batch's, so W ranks (uneven, one empty) give 1 rank's "
          "gradient, for vq and (per layer) residual_vq") {
  Generator data(3, 0);
  Tensor x = rand_normal({13, 4}, data);
  for (const char* type : {"vq", "residual_vq"}) {
    CAPTURE(type);
    nlohmann::json j = {{"type", type}, {"codebook_size", 8}, {"kmeans_init", false},
                        {"commitment_weight", 0.0},  // the diversity loss alone
                        {"codebook_diversity_loss_weight", 1.0},
                        {"codebook_diversity_temperature", 2.0}};  // soft enough for a gradient everywhere
    if (std::string(type) == "residual_vq") j["num_quantizers"] = 2;
    const QuantizerOptions q = parse_quantizer_options(j);
    auto run = [&](int w, const std::vector<int64_t>& sizes, std::vector<Tensor>& grads, std::vector<float>& losses) {
      grads.assign(w, Tensor());
      losses.assign(w, 0.f);
      run_ranks(w, [&](Communicator& comm) {
        Generator init(0, 0);
        std::shared_ptr<Quantizer> m = make_quantizer(q, 4, 1, init);
        m->train();
        Tensor xr = shard(x, sizes, comm.rank()).clone();
        xr.set_requires_grad(true);
        QuantizerOutput out = m->quantize(xr, comm);
        losses[comm.rank()] = out.loss.item<float>();
        CHECK(out.extra("codebook_diversity_loss").item<float>() < 0);
        // The loss is the global one on every rank: each backpropagates 1/W
        // of it, and the average's backward sums the ranks' shares.
        mul(out.loss, 1.f / static_cast<float>(w)).backward();
        grads[comm.rank()] = xr.grad().defined() ? xr.grad() : zeros(xr.shape());
      }, kFast);
    };
    std::vector<Tensor> reference;
    std::vector<float> reference_loss;
    run(1, {13}, reference, reference_loss);
    CHECK(sum(square(reference[0])).item<float>() > 1e-6f);
    for (int w : {2, 3}) {
      CAPTURE(w);
      std::vector<Tensor> grads;
      std::vector<float> losses;
      run(w, w == 2 ? std::vector<int64_t>{4, 9} : std::vector<int64_t>{0, 5, 8}, grads, losses);
      for (float l : losses) CHECK(l == doctest::Approx(reference_loss[0]).epsilon(1e-6));
      check_close({{"grad", concat(grads, 0)}}, {{"grad", reference[0]}}, 1e-4, 1e-7);
    }
  }
}

TEST_CASE("freeze_codebook: after k-means init a training step changes no codebook state, issues no collective and "
          "gives a learnable codebook no gradient") {
  SingleCommunicator comm;
  Generator init(0, 0), data(1, 0);
  VectorQuantizeOptions o = base(4);
  o.freeze_codebook = true;
  VectorQuantize vq(o, init);
  vq.quantize(rand_normal({10, 4}, data), comm);  // k-means init runs once
  CHECK(vq.codebooks()[0]->initted());
  NamedTensors after_init = vq.state_copy();
  const uint64_t before = comm.counters().collectives;
  for (int s = 0; s < 2; ++s) {
    Tensor x = rand_normal({10, 4}, data);
    x.set_requires_grad(true);
    QuantizerOutput out = vq.quantize(x, comm);
    add(sum(out.quantized), out.loss).backward();
    CHECK(out.metrics[0].codes_used() == 0);  // the metrics of a step that does not update
  }
  CHECK(test::first_difference(vq.state_copy(), after_init) == "");
  CHECK(comm.counters().collectives == before);

  ResidualVQOptions r;
  r.dim = 4;
  r.num_quantizers = 2;
  r.codebook_size = 8;
  r.codebook.kmeans_iters = 3;
  r.freeze_codebook = true;
  ResidualVQ rvq(r, init);
  rvq.quantize(rand_normal({10, 4}, data), comm);
  NamedTensors rvq_after_init = rvq.state_copy();
  rvq.quantize(rand_normal({10, 4}, data), comm);
  CHECK(test::first_difference(rvq.state_copy(), rvq_after_init) == "");

  VectorQuantizeOptions l = o;
  l.codebook.learnable = true;
  l.codebook.kmeans_init = false;
  VectorQuantize learnable(l, init);
  Tensor x = rand_normal({10, 4}, data);
  x.set_requires_grad(true);
  QuantizerOutput out = learnable.quantize(x, comm);
  add(sum(out.quantized), out.loss).backward();
  CHECK(x.grad().defined());
  CHECK_FALSE(learnable.codebooks()[0]->embed.grad().defined());
}

TEST_CASE("layernorm_after_project_in: the codebook sees project_in's rows normalised (mean 0, variance 1)") {
  SingleCommunicator comm;
  Generator init(0, 0), data(1, 0);
  VectorQuantizeOptions o = base(6);
  o.codebook_dim = 4;  // a projection: the LayerNorm exists only with one
  o.layernorm_after_project_in = true;
  o.codebook.kmeans_iters = 1;
  VectorQuantize vq(o, init);
  int found = 0;
  for (const auto& [name, t] : vq.named_parameters()) found += name == "project_in_norm.weight" || name == "project_in_norm.bias";
  CHECK(found == 2);
  // Eight rows for eight codes: k-means' first draw picks codes among the
  // normalised rows, each of mean 0 and variance 1 (up to LayerNorm's eps).
  vq.quantize(mul(rand_normal({8, 6}, data), 5.f), comm);
  std::vector<float> e = vq.codebooks()[0]->embed.to_vector<float>();
  for (int k = 0; k < 8; ++k) {
    double m = 0, v = 0;
    for (int j = 0; j < 4; ++j) m += e[k * 4 + j] / 4.0;
    for (int j = 0; j < 4; ++j) v += std::pow(e[k * 4 + j] - m, 2) / 4.0;
    CHECK(std::fabs(m) < 1e-5);
    CHECK(v == doctest::Approx(1.0).epsilon(1e-3));
  }
}

TEST_CASE("the commitment loss applies its weight") {
  SingleCommunicator comm;
  Generator init(0, 0), data(1, 0);
  VectorQuantize vq(base(4), init);
  Tensor x = rand_normal({10, 4}, data);
  vq.quantize(x, comm);  // initialise
  vq.eval();
  QuantizerOutput out = vq.quantize(x, comm);
  Tensor q = vq.codebooks()[0]->lookup(reshape(out.indices, {-1}));
  CHECK(out.loss.item<float>() == doctest::Approx(0.5f * mse_loss(q, x).item<float>()).epsilon(1e-6));
  // Straight-through output equals the codes up to the rounding of x + (q - x).
  check_close({{"q", out.quantized}}, {{"q", q}}, 1e-6, 1e-6);
}

TEST_CASE("project_in/out exist exactly when codebook_dim * heads differs from dim") {
  Generator init(0, 0);
  VectorQuantizeOptions o = base(6);
  CHECK(VectorQuantize(o, init).named_parameters().empty());
  o.codebook_dim = 3;
  VectorQuantize projected(o, init);
  std::vector<std::string> names;
  for (auto& [n, t] : projected.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"project_in.weight", "project_in.bias", "project_out.weight", "project_out.bias"});
  SingleCommunicator comm;
  Generator data(2, 0);
  Tensor x = rand_normal({12, 6}, data);
  QuantizerOutput out = projected.quantize(x, comm);
  CHECK(out.quantized.shape() == Shape{12, 6});
  mean(square(out.quantized)).backward();
  CHECK(projected.named_parameters()[0].second.grad().defined());
}

TEST_CASE("heads: a shared codebook sees every head's rows; separate codebooks one head each") {
  SingleCommunicator comm;
  Generator data(3, 0);
  Tensor x = rand_normal({10, 8}, data);
  for (bool separate : {false, true}) {
    CAPTURE(separate);
    Generator init(0, 0);
    VectorQuantizeOptions o = base(8, 2);
    o.separate_codebook_per_head = separate;
    VectorQuantize vq(o, init);
    CHECK(vq.codebooks().size() == (separate ? 2u : 1u));
    QuantizerOutput out = vq.quantize(x, comm);
    CHECK(out.indices.shape() == Shape{10, 2});
    CHECK(out.metrics.size() == (separate ? 2u : 1u));
    CHECK(out.metrics[0].rows() == (separate ? 10 : 20));
    // Decoding the indices in eval reproduces the eval output.
    vq.eval();
    QuantizerOutput ev = vq.quantize(x, comm);
    check_close({{"decode", vq.decode(ev.indices)}}, {{"decode", ev.quantized}}, 1e-6, 1e-6);
    // Head 1 of every row is the nearest code of its codebook to x[:, 4:8].
    const Codebook& book1 = *vq.codebooks()[separate ? 1 : 0];
    Tensor head1 = reshape(transpose(reshape(x, {10, 2, 4}), 0, 1), {20, 4}).slice_rows(10, 20);  // (10, 4)
    Tensor want = assign_codes(head1, book1.embed, false);
    Tensor got = reshape(transpose(ev.indices), {20}).slice_rows(10, 20);
    CHECK(got.to_vector<int64_t>() == want.to_vector<int64_t>());
  }
}

TEST_CASE("invariants 1, 2, 4 for VectorQuantize with heads, bitwise: every rank's state is == 1 rank's on the whole "
          "batch after k-means init, EMA and revival (shared and separate codebooks, with and without project_in; "
          "W = 2..5, every split kind), eval issues no collective") {
  std::vector<Tensor> batches;
  Generator data(12, 0);
  for (int s = 0; s < 4; ++s) batches.push_back(rand_normal({21, 8}, data));
  for (bool separate : {false, true})
    for (int64_t codebook_dim : {0, 3}) {  // 3: project_in 8 -> 6, the batch-invariant forward matmul before the codebooks
      CAPTURE(separate);
      CAPTURE(codebook_dim);
      VectorQuantizeOptions o = base(8, 2);
      o.separate_codebook_per_head = separate;
      o.codebook_dim = codebook_dim;
      // Revival (all_gather_rows) takes part: thresholds near the mean rows
      // per code (21 or 42 rows for 8 codes), so some codes die each step.
      o.codebook.threshold_ema_dead_code = separate ? 1.5f : 3.f;
      struct Run {
        std::vector<NamedTensors> states;                  // after each step
        std::vector<std::vector<CodebookMetrics>> metrics;  // per step, per codebook
        bool initted_before = true;                         // any codebook initialised before step 0
      };
      auto run = [&](int w, const std::string& split, Device device) {
        std::vector<Run> runs(w);
        run_ranks(w, [&](Communicator& comm) {
          Generator init(0, 0);
          VectorQuantize vq(o, init);
          vq.to(device);
          Run& mine = runs[comm.rank()];
          mine.initted_before = false;
          for (auto& book : vq.codebooks()) mine.initted_before |= book->initted();
          for (const Tensor& x : batches) {
            QuantizerOutput out = vq.quantize(shard(x, split_sizes(21, w, split), comm.rank()).to(device), comm);
            mine.states.push_back(snapshot(vq));
            mine.metrics.push_back(out.metrics);
          }
          for (auto& book : vq.codebooks()) CHECK(book->initted());
          vq.eval();
          uint64_t before = comm.counters().collectives;
          vq.quantize(shard(batches[0], split_sizes(21, w, split), comm.rank()).to(device), comm);
          CHECK(comm.counters().collectives == before);
        }, kFast);
        return runs;
      };
      Run one = run(1, "even", Device::cpu())[0];
      CHECK_FALSE(one.initted_before);  // step 0 runs k-means init
      int64_t revived_first = 0, revived_later = 0;
      for (size_t s = 0; s < batches.size(); ++s)
        for (const CodebookMetrics& m : one.metrics[s]) (s == 0 ? revived_first : revived_later) += m.codes_revived();
      CHECK(revived_first > 0);  // init and revival in the same step
      CHECK(revived_later > 0);
      check_traces_equal(run(1, "even", Device::sim()), one);
      for (Device device : kTestDevices) {  // on sim as on the CPU
        CAPTURE(device.str());
        for_each_split(21, 2, 5, [&](int w, const std::string& split) { check_traces_equal(run(w, split, device), one); });
      }
    }
}

TEST_CASE("masked rows change nothing and get index -1; W ranks with masks equal 1 rank without the masked rows, "
          "bitwise") {
  Generator data(4, 0);
  Tensor x = rand_normal({24, 4}, data);
  std::vector<int64_t> keep(24);
  for (int i = 0; i < 24; ++i) keep[i] = i % 3 != 0;
  Tensor mask = from_vector(keep, {24});
  std::vector<int64_t> kept_rows;
  for (int i = 0; i < 24; ++i)
    if (keep[i]) kept_rows.push_back(i);
  Tensor compact = index_select(x, from_vector(kept_rows, {16}));

  VectorQuantizeOptions o = base(4);
  o.codebook.threshold_ema_dead_code = 1.f;
  NamedTensors reference;
  run_ranks(1, [&](Communicator& comm) {
    Generator init(0, 0);
    VectorQuantize vq(o, init);
    vq.quantize(compact, comm);
    vq.quantize(compact, comm);
    reference = snapshot(vq);
  }, kFast);
  run_ranks(3, [&](Communicator& comm) {
    Generator init(0, 0);
    VectorQuantize vq(o, init);
    Tensor xs = x.slice_rows(comm.rank() * 8, comm.rank() * 8 + 8);
    Tensor ms = mask.slice_rows(comm.rank() * 8, comm.rank() * 8 + 8);
    QuantizerOutput out = vq.quantize(xs, comm, ms);
    out = vq.quantize(xs, comm, ms);
    CHECK(first_difference(snapshot(vq), reference) == "");  // invariant 2: bitwise
    for (int i = 0; i < 8; ++i) {
      bool kept = ms.data<int64_t>()[i] != 0;
      CHECK((out.indices.data<int64_t>()[i] == -1) == !kept);
      if (!kept)
        CHECK(slice_rows(out.quantized, i, i + 1).to_vector<float>() == slice_rows(xs, i, i + 1).to_vector<float>());
    }
  }, kFast);
}

TEST_CASE("a learnable codebook is trained by gradients: no EMA, a codebook loss, one counts all-reduce") {
  SingleCommunicator comm;
  Generator init(0, 0), data(5, 0);
  VectorQuantizeOptions o = base(4);
  o.codebook.learnable = true;
  VectorQuantize vq(o, init);
  CHECK(vq.named_parameters().size() == 1);
  CHECK(vq.named_parameters()[0].first == "codebook.embed");
  Tensor x = rand_normal({16, 4}, data);
  vq.quantize(x, comm);  // k-means init
  Tensor before = vq.codebooks()[0]->embed.clone();
  uint64_t calls = comm.counters().collectives;
  QuantizerOutput out = vq.quantize(x, comm);
  CHECK(comm.counters().collectives == calls + 1);
  CHECK(vq.codebooks()[0]->embed.to_vector<float>() == before.to_vector<float>());  // forward does not move it
  out.loss.backward();
  Tensor g = vq.codebooks()[0]->embed.grad();
  REQUIRE(g.defined());
  CHECK(sum(square(g)).item<float>() > 0.f);
}

TEST_CASE("an empty batch and an all-masked batch are valid in training") {
  SingleCommunicator comm;
  Generator init(0, 0), data(6, 0);
  VectorQuantize vq(base(4), init);
  vq.quantize(rand_normal({10, 4}, data), comm);
  QuantizerOutput out = vq.quantize(zeros({0, 4}), comm);
  CHECK(out.quantized.shape() == Shape{0, 4});
  CHECK(out.loss.item<float>() == 0.f);
  out = vq.quantize(ones({3, 4}), comm, zeros({3}, DType::i64));
  CHECK(out.indices.to_vector<int64_t>() == std::vector<int64_t>(3, -1));
  CHECK_THROWS_WITH_AS(vq.quantize(ones({3, 5}), comm), doctest::Contains("VectorQuantize expects [N, 4]"), Error);
}

TEST_CASE("decode uses the codes the forward used: learnable cosine codebooks decode normalised") {
  // A learnable cosine codebook is normalised where it is used, and the
  // optimizer moves embed off the unit sphere; decode must not read raw
  // embed rows (it did before decode went through Codebook::lookup).
  SingleCommunicator comm;
  Generator data(4, 0);
  Tensor x = rand_normal({12, 4}, data);
  auto off_the_sphere = [](Tensor embed) {  // a handle: writes reach the codebook
    NoGradGuard no_grad;
    embed.copy_(mul(embed, 3.f));  // what optimizer steps do over time
  };
  VectorQuantizeOptions o = base(4);
  o.codebook.cosine = true;
  o.codebook.learnable = true;
  Generator init(0, 0);
  VectorQuantize vq(o, init);
  vq.quantize(x, comm);  // k-means init
  off_the_sphere(vq.codebooks()[0]->embed);
  vq.eval();
  QuantizerOutput ev = vq.quantize(x, comm);
  check_close({{"decode", vq.decode(ev.indices)}}, {{"decode", ev.quantized}}, 1e-6, 1e-6);

  ResidualVQOptions r;
  r.dim = 4;
  r.num_quantizers = 2;
  r.codebook_size = 8;
  r.codebook.cosine = true;
  r.codebook.learnable = true;
  r.codebook.kmeans_iters = 3;
  Generator init2(0, 0);
  ResidualVQ rvq(r, init2);
  rvq.quantize(x, comm);
  for (int l = 0; l < 2; ++l) off_the_sphere(rvq.codebook(l).embed);
  rvq.eval();
  QuantizerOutput rev = rvq.quantize(x, comm);
  check_close({{"decode", rvq.decode(rev.indices)}}, {{"decode", rev.quantized}}, 1e-5, 1e-5);
}

TEST_CASE("cosine VectorQuantize commits the unit input to its code, and the output's gradient is the "
          "unit vector's (the reference normalises before everything)") {
  Generator init(0, 0), data(2, 0);
  SingleCommunicator comm;
  VectorQuantizeOptions o = base(4);
  o.codebook.cosine = true;
  o.rotation_trick = false;
  VectorQuantize vq(o, init);
  Tensor x = mul(rand_normal({12, 4}, data), 3.f);
  x.set_requires_grad(true);
  QuantizerOutput out = vq.quantize(x, comm);
  // loss = w * mean((q - x/|x|)^2): with |x| ~ 6 the unnormalised input would give ~ w * 10.
  std::vector<float> px = x.to_vector<float>(), q = out.quantized.to_vector<float>();
  double se = 0;
  for (int64_t r = 0; r < 12; ++r) {
    double norm = 0;
    for (int j = 0; j < 4; ++j) norm += double(px[r * 4 + j]) * px[r * 4 + j];
    norm = std::sqrt(norm);
    for (int j = 0; j < 4; ++j) se += std::pow(q[r * 4 + j] - px[r * 4 + j] / norm, 2);
  }
  CHECK(out.loss.item<float>() == doctest::Approx(0.5 * se / 48).epsilon(1e-5));
  // Straight-through onto the unit vector: d(sum q)/dx = (I - u u^T) 1 / |x|, orthogonal to x.
  sum(out.quantized).backward();
  std::vector<float> g = x.grad().to_vector<float>();
  for (int64_t r = 0; r < 12; ++r) {
    double dot = 0, norm = 0;
    for (int j = 0; j < 4; ++j) dot += double(g[r * 4 + j]) * px[r * 4 + j], norm += double(px[r * 4 + j]) * px[r * 4 + j];
    CHECK(std::fabs(dot) / std::sqrt(norm) < 1e-5);
  }
}

TEST_CASE("directional_reparam (DiVeQ): the output is x + u |q - x| with u the noised unit direction, no commitment "
          "loss, the gradient reaching input and codes; the learnable codebook tracks usage and revives dead codes") {
  SingleCommunicator comm;
  Generator data(5, 0);
  VectorQuantizeOptions o = initial_codes();
  o.codebook.learnable = true;
  o.codebook.threshold_ema_dead_code = 1.f;  // unused codes fall to 0.99 of their initial 1 in one step
  o.rotation_trick = false;
  o.directional_reparam = true;
  o.directional_reparam_variance = 0.f;  // the exact direction: y = q in value
  Generator init(0, 0);
  VectorQuantize vq(o, init);
  Codebook& book = *vq.codebooks()[0];
  const std::vector<float> e0 = book.embed.to_vector<float>();
  // Every row near code 0, so the other codes die in the first update and are revived from rows.
  Tensor x = add(mul(rand_normal({12, 4}, data), 0.01f), from_vector(std::vector<float>(e0.begin(), e0.begin() + 4), {1, 4}));
  x.set_requires_grad(true);
  QuantizerOutput out = vq.quantize(x, comm);
  CHECK(out.loss.item<float>() == 0.f);
  std::vector<float> q = out.quantized.to_vector<float>();
  for (int64_t i = 0; i < 12 * 4; ++i) CHECK(q[i] == doctest::Approx(e0[i % 4]).epsilon(1e-5));
  sum(mul(out.quantized, out.quantized)).backward();
  CHECK(book.embed.grad().defined());
  double code_grad = 0;
  for (float g : book.embed.grad().to_vector<float>()) code_grad += std::fabs(g);
  CHECK(code_grad > 0);
  double input_grad = 0;
  for (float g : x.grad().to_vector<float>()) input_grad += std::fabs(g);
  CHECK(input_grad > 0);
  // Usage: code 0 counted 12 rows (decay 0.99 from 1), the others revived with rows of the batch.
  CHECK(book.cluster_size.defined());
  const std::vector<float> cs = book.cluster_size.to_vector<float>(), e1 = book.embed.to_vector<float>();
  CHECK(cs[0] == doctest::Approx(0.99 + 0.01 * 12));
  CHECK(out.metrics[0].codes_revived() == 7);
  const std::vector<float> xs = x.to_vector<float>();
  for (int k = 1; k < 8; ++k) {
    bool from_a_row = false;
    for (int n = 0; n < 12; ++n) from_a_row |= std::equal(e1.begin() + k * 4, e1.begin() + k * 4 + 4, xs.begin() + n * 4);
    CHECK(from_a_row);
  }
  // With noise the direction moves, the length |q - x| stays.
  o.directional_reparam_variance = 0.5f;
  Generator init2(0, 0);
  VectorQuantize noisy(o, init2);
  QuantizerOutput n = noisy.quantize(x.detach(), comm);
  const std::vector<float> qn = n.quantized.to_vector<float>();
  for (int r = 0; r < 12; ++r) {
    double want = 0, got = 0;
    for (int j = 0; j < 4; ++j) {
      want += std::pow(double(e0[j]) - xs[r * 4 + j], 2);
      got += std::pow(double(qn[r * 4 + j]) - xs[r * 4 + j], 2);
    }
    CHECK(std::sqrt(got) == doctest::Approx(std::sqrt(want)).epsilon(1e-4));
  }
}
