// FSP (vq/fsp.h): the bins, output, indices and vector-norm loss against a
// double computation of the reference's formulas; the perturbation within
// half a bin in training only; decode(indices) == the unperturbed output;
// and the moments of the GLOBAL batch (W ranks' loss and input gradient ==
// 1 rank's, bit for bit, in exact steps).
#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>

#include "comm/batch_reduce.h"
#include "comm/single.h"
#include "comm/thread_group.h"
#include "engine/autograd.h"
#include "engine/exact_batch.h"
#include "engine/ops.h"
#include "tests/vq/harness.h"
#include "vq/fsp.h"

using namespace vqddp;

namespace {

FSPOptions options(float rate) {
  FSPOptions o;
  o.levels = {3, 5, 4};
  o.quantize_rate = rate;
  o.vector_norm = "kurt";  // every moment in the loss
  o.seed = 9;
  return o;
}

}  // namespace

TEST_CASE("FSP without perturbation: bins of the tanh CDF, unit-variance output, mixed-radix indices and the vector "
          "norm of the batch's moments, as the reference computes them") {
  Generator init(0, 0), data(4, 0);
  FSP fsp(options(1.f), init);
  fsp.train();
  SingleCommunicator comm;
  Tensor x = rand_normal({16, 3}, data);
  QuantizerOutput out = fsp.quantize(x, comm);
  const std::vector<float> xs = x.to_vector<float>(), q = out.quantized.to_vector<float>();
  const std::vector<int64_t> idx = out.indices.to_vector<int64_t>();
  const int levels[3] = {3, 5, 4}, basis[3] = {1, 3, 15};
  for (int n = 0; n < 16; ++n) {
    int64_t want = 0;
    for (int j = 0; j < 3; ++j) {
      double a = (std::tanh(double(xs[n * 3 + j])) + 1) / 2;
      int l = static_cast<int>(std::floor(std::min(a, 1.0 - FLT_EPSILON) * levels[j]));
      CHECK(q[n * 3 + j] == doctest::Approx(((l + 0.5) / levels[j] - 0.5) / 0.28867513459481287).epsilon(1e-5));
      want += l * basis[j];
    }
    CHECK(idx[n] == want);
  }
  double loss = 0;
  const double target[4] = {0, 1, 0, 0}, weight[4] = {0.1, 0.07, 0.06, 0.05};
  double terms[4] = {0, 0, 0, 0};
  for (int j = 0; j < 3; ++j) {
    double mean = 0, m2 = 0, m3 = 0, m4 = 0;
    for (int n = 0; n < 16; ++n) mean += xs[n * 3 + j] / 16.0;
    for (int n = 0; n < 16; ++n) {
      double c = xs[n * 3 + j] - mean;
      m2 += c * c, m3 += c * c * c, m4 += c * c * c * c;
    }
    double var = m2 / 15, sd = std::sqrt(var);
    double stats[4] = {mean, var, m3 / 16 / (sd * sd * sd), m4 / 16 / (var * var) - 3};
    for (int i = 0; i < 4; ++i) terms[i] += std::pow(stats[i] - target[i], 2) / 3;
  }
  for (int i = 0; i < 4; ++i) loss += weight[i] * terms[i];
  CHECK(out.loss.item<float>() == doctest::Approx(loss).epsilon(1e-4));
  // The loss's gradient (the moments' dependence on the mean included)
  // against central differences of the loss.
  Tensor xg = x.clone();
  xg.set_requires_grad(true);
  fsp.quantize(xg, comm).loss.backward();
  const std::vector<float> grad = xg.grad().to_vector<float>();
  for (int i : {0, 7, 20, 41}) {
    CAPTURE(i);
    auto loss_at = [&](float delta) {
      Tensor xd = x.clone();
      xd.data<float>()[i] += delta;
      return double(fsp.quantize(xd, comm).loss.item<float>());
    };
    CHECK(grad[i] == doctest::Approx((loss_at(1e-2f) - loss_at(-1e-2f)) / 2e-2).epsilon(2e-2).scale(1e-3));
  }
  // decode(indices) is the unperturbed output.
  CHECK(test::first_difference({{"q", fsp.decode(out.indices)}}, {{"q", out.quantized.detach()}}) == "");
}

TEST_CASE("FSP perturbs within half a bin in training steps only, keeping the unperturbed indices") {
  Generator init(0, 0), data(5, 0);
  FSP fsp(options(0.f), init);
  SingleCommunicator comm;
  Tensor x = rand_normal({32, 3}, data);
  fsp.eval();
  QuantizerOutput plain = fsp.quantize(x, comm);
  CHECK_FALSE(plain.extras.contains("p_accept_prob"));
  fsp.train();
  QuantizerOutput moved = fsp.quantize(x, comm);
  CHECK(test::first_difference({{"i", moved.indices}}, {{"i", plain.indices}}) == "");
  const std::vector<float> a = plain.quantized.to_vector<float>(), b = moved.quantized.detach().to_vector<float>();
  int differ = 0;
  const int levels[3] = {3, 5, 4};
  for (size_t i = 0; i < a.size(); ++i) {
    differ += a[i] != b[i];
    // Output units: half a bin of [0, 1] is 1 / (2 L), over 0.2887; the
    // perturbed value moves from the activation, at most a bin from the centre.
    CHECK(std::fabs(a[i] - b[i]) <= (1.0 / levels[i % 3]) / 0.28867513459481287 + 1e-4);
  }
  CHECK(differ > 80);
  const float accepted = moved.extra("p_accept_prob").item<float>();
  CHECK(accepted > 0.5f);
  CHECK(accepted <= 1.f);
}

TEST_CASE("FSP in exact steps: the moments are the global batch's, so W ranks (uneven, one empty) give 1 rank's loss, "
          "output and input gradient bit for bit") {
  Generator data(6, 0);
  Tensor x = rand_normal({13, 3}, data), g = rand_normal({13, 3}, data);
  auto run = [&](const std::vector<int64_t>& sizes) {
    const int w = static_cast<int>(sizes.size());
    std::vector<Tensor> q(w), grad(w);
    std::vector<float> loss(w);
    run_ranks(w, [&](Communicator& comm) {
      Generator init(0, 0);
      FSP fsp(options(0.3f), init);
      fsp.train();
      const int r = comm.rank();
      int64_t begin = 0;
      for (int i = 0; i < r; ++i) begin += sizes[i];
      ExactBatchScope exact(exact_batch_for(comm, std::vector<int64_t>(sizes[r], 1), sizes));
      Tensor xr = requires_input_grad(x.slice_rows(begin, begin + sizes[r]).clone());
      QuantizerOutput out = fsp.quantize(xr, comm);
      add(sum(mul(out.quantized, g.slice_rows(begin, begin + sizes[r]))), out.loss).backward();
      q[r] = out.quantized.detach();
      grad[r] = xr.grad();
      loss[r] = out.loss.item<float>();
    });
    return std::make_tuple(concat(q, 0), concat(grad, 0), loss);
  };
  auto [q1, g1, l1] = run({13});
  auto [q3, g3, l3] = run({5, 0, 8});
  CHECK(test::first_difference({{"quantized", q3}, {"grad", g3}}, {{"quantized", q1}, {"grad", g1}}) == "");
  for (float l : l3) CHECK(l == l1[0]);
}

TEST_CASE("FSP's normal, laplace and cauchy CDFs: the bins and indices of the reference's formulas; with need_inv_act "
          "the output is the inverse CDF of the bin centre (laplace, cauchy), and normal's inverse is refused") {
  SingleCommunicator comm;
  struct Cdf {
    const char* name;
    double (*cdf)(double);
    double (*inv)(double);
  };
  const Cdf cdfs[] = {
      {"normal", [](double z) { return (1 + std::erf(z / std::sqrt(2.0))) / 2; }, nullptr},
      {"laplace", [](double z) { return 0.5 * (1 + (z > 0 ? 1 : z < 0 ? -1 : 0) * (1 - std::exp(-std::fabs(z)))); },
       [](double p) { return -(p > 0.5 ? 1 : p < 0.5 ? -1 : 0) * std::log(1 - 2 * std::fabs(p - 0.5)); }},
      {"cauchy", [](double z) { return std::atan(z) / 3.14159265358979323846 + 0.5; },
       [](double p) { return std::tan((p - 0.5) * 3.14159265358979323846); }},
  };
  for (const Cdf& c : cdfs) {
    CAPTURE(c.name);
    for (bool inv : {false, true}) {
      if (inv && !c.inv) {
        Generator init(0, 0);
        FSPOptions o = options(1.f);
        o.act_name = c.name;
        o.need_inv_act = true;
        CHECK_THROWS_WITH_AS(FSP(o, init), doctest::Contains("erfinv"), Error);
        continue;
      }
      Generator init(0, 0), data(4, 0);
      FSPOptions o = options(1.f);
      o.act_name = c.name;
      o.need_inv_act = inv;
      FSP fsp(o, init);
      Tensor x = mul(rand_normal({24, 3}, data), 2.f);
      QuantizerOutput out = fsp.quantize(x, comm);
      const std::vector<float> xs = x.to_vector<float>(), q = out.quantized.to_vector<float>();
      const std::vector<int64_t> idx = out.indices.to_vector<int64_t>();
      const int levels[3] = {3, 5, 4}, basis[3] = {1, 3, 15};
      for (int n = 0; n < 24; ++n) {
        int64_t want = 0;
        for (int j = 0; j < 3; ++j) {
          const double a = c.cdf(double(xs[n * 3 + j]));
          const int l = static_cast<int>(std::floor(std::min(a, 1.0 - FLT_EPSILON) * levels[j]));
          const double centre = (l + 0.5) / levels[j];
          const double expect = inv ? c.inv(centre) : (centre - 0.5) / 0.28867513459481287;
          CHECK(q[n * 3 + j] == doctest::Approx(expect).epsilon(1e-5));
          want += l * basis[j];
        }
        CHECK(idx[n] == want);
      }
    }
  }
}
