// RandomProjectionQuantizer (BEST-RQ targets): the formula held by hand, its
// frozen state, its projections' spread, and its refusal as a model's
// quantizer. Every-type tests (W ranks == 1 rank, the contract, sim) reach
// it through the registry.
#include <doctest/doctest.h>

#include <cmath>

#include "comm/single.h"
#include "engine/core/error.h"
#include "tests/vq/factory_options.h"
#include "tests/vq/harness.h"
#include "vq/random_projection.h"

using namespace vqddp;
using namespace vqddp::test;

TEST_CASE("random_projection: each row's code is the nearest by cosine to its layer-normalised projection, and a "
          "training step changes no state and issues no collective") {
  for (bool norm : {true, false}) {
    CAPTURE(norm);
    Generator init(0, 0), data(1, 0);
    RandomProjectionOptions o;
    o.dim = 6;
    o.codebook_size = 16;
    o.codebook_dim = 3;
    o.norm = norm;
    RandomProjectionQuantizer q(o, init);
    q.train();
    const NamedTensors before = q.state_copy();
    Tensor x = rand_normal({40, 6}, data);
    SingleCommunicator comm;
    QuantizerOutput out = q.quantize(x, comm);
    CHECK(comm.counters().collectives == 0);
    CHECK(first_difference(q.state_copy(), before) == "");
    CHECK_FALSE(out.quantized.requires_grad());
    const std::vector<float> p = named(before, "rand_projs").to_vector<float>();      // (1, 6, 3)
    const std::vector<float> e = named(before, "vq.codebook.embed").to_vector<float>();  // (16, 3): one head, one codebook
    const std::vector<float> xs = x.to_vector<float>();
    const std::vector<int64_t> got = out.indices.to_vector<int64_t>();
    for (int64_t r = 0; r < 40; ++r) {
      double v[6], mean = 0, var = 0;
      for (int j = 0; j < 6; ++j) mean += (v[j] = xs[r * 6 + j]) / 6;
      for (double& t : v) var += (t - mean) * (t - mean) / 6;
      if (norm)
        for (double& t : v) t = (t - mean) / std::sqrt(var + 1e-5);
      double z[3] = {0, 0, 0};
      for (int j = 0; j < 6; ++j)
        for (int c = 0; c < 3; ++c) z[c] += v[j] * p[j * 3 + c];
      int64_t best = -1;
      double best_sim = -2;
      for (int64_t k = 0; k < 16; ++k) {
        double dot = 0, nn = 0;
        for (int c = 0; c < 3; ++c) {
          dot += z[c] * e[k * 3 + c];
          nn += double(e[k * 3 + c]) * e[k * 3 + c];
        }
        if (dot / std::sqrt(nn) > best_sim) best_sim = dot / std::sqrt(nn), best = k;
      }
      CHECK(got[r] == best);
    }
  }
}

TEST_CASE("random_projection: the projections are Xavier-normal, std sqrt(2 / (codebook_dim (dim + num_codebooks)))") {
  Generator init(0, 0);
  RandomProjectionOptions o;
  o.dim = 96;
  o.codebook_dim = 32;
  o.num_codebooks = 2;
  RandomProjectionQuantizer q(o, init);
  const std::vector<float> p = named(q.state_copy(), "rand_projs").to_vector<float>();
  REQUIRE(p.size() == 2u * 96 * 32);
  double sum = 0, sq = 0;
  for (float v : p) sum += v, sq += double(v) * v;
  const double n = static_cast<double>(p.size()), want = std::sqrt(2.0 / (32.0 * (96 + 2)));
  CHECK(std::abs(sum / n) < 0.05 * want);
  CHECK(std::abs(std::sqrt(sq / n) / want - 1) < 0.03);  // 6144 draws: the estimate's spread is about 1%
}

TEST_CASE("random_projection: codebook_dim is required; a config refuses it as a model's quantizer") {
  CHECK_THROWS_WITH_AS(parse_quantizer_options({{"type", "random_projection"}}),
                       doctest::Contains("'codebook_dim' is required for type \"random_projection\""), Error);
  const QuantizerOptions q = options_for("random_projection", {{"codebook_dim", 5}, {"norm", false}});
  CHECK(q.as<RandomProjectionOptions>().codebook_dim == 5);
  CHECK_FALSE(q.as<RandomProjectionOptions>().norm);
  CHECK_FALSE(q.kind().trains_encoder);
}
