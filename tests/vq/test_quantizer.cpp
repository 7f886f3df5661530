// Every quantizer type through the Quantizer contract (vq/quantizer.h), made
// by the factory from options: the DDP invariants (W ranks == 1 rank on the
// whole batch, bit for bit, docs/design.md section 7) hold through the
// interface for every type, and the contract's shapes, decode, layer sizes
// and bits say what they promise.
#include <doctest/doctest.h>

#include <cmath>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "comm/single.h"
#include "engine/core/random.h"
#include "engine/core/streams.h"
#include "tests/vq/harness.h"
#include "tests/vq/quantizer_trace.h"
#include "vq/quantizer_options.h"
#include "vq/residual_vq.h"

namespace vqddp {
namespace {

using test::for_each_split;
using test::per_rank;
using test::kDim;
using test::kRows;
using test::kSteps;
using test::options_for;
using test::make;
using test::Trace;
using test::run;

}  // namespace

// Invariants 1-2 through the interface: W ranks' outputs, indices, state
// and metrics (each rank's) are == 1 rank's on the whole batch, W = 2..3,
// every split kind.
void check_w_ranks_equal_one(const QuantizerOptions& q) {
  Trace one = per_rank(1, [&](Communicator& comm) { return run(q, comm, {kRows}); })[0];
  for_each_split(kRows, 2, 3, [&](int w, const std::string& split) {
    std::vector<int64_t> sizes = test::split_sizes(kRows, w, split);
    std::vector<Trace> ranks = per_rank(w, [&](Communicator& comm) { return run(q, comm, sizes); });
    test::check_traces_equal(ranks, one);
    for (int s = 0; s < kSteps; ++s) {
      CAPTURE(s);
      std::vector<Tensor> qs, is;
      for (int r = 0; r < w; ++r) {
        qs.push_back(ranks[r].quantized[s]);
        is.push_back(ranks[r].indices[s]);
      }
      CHECK(test::first_difference({{"quantized", concat(qs, 0)}, {"indices", concat(is, 0)}},
                                   {{"quantized", one.quantized[s]}, {"indices", one.indices[s]}}) == "");
    }
  });
}

TEST_CASE("every quantizer type through the Quantizer interface: W ranks' outputs, indices, state and metrics are == 1 "
          "rank's on the whole batch, W = 2..3, every split") {
  for (const std::string& type : quantizer_types()) {
    CAPTURE(type);
    check_w_ranks_equal_one(options_for(type));
  }
}

TEST_CASE("the Quantizer contract: indices (N, Q) within the layer sizes, a scalar loss, decode(indices) is the eval "
          "output, bits = sum of log2(layer size)") {
  for (const std::string& type : quantizer_types()) {
    CAPTURE(type);
    QuantizerOptions q = options_for(type);
    run_ranks(1, [&](Communicator& comm) {
      std::shared_ptr<Quantizer> m = make(q);
      Generator data(3);
      Tensor x = rand_normal({kRows, kDim}, data);
      m->train();
      QuantizerOutput train_out = m->quantize(x, comm);  // initialises codebooks (k-means)
      CHECK(train_out.loss.dim() == 0);
      // Invariant 4: inference (eval, or training mode without grad) issues
      // no collective, so a pass only some ranks run cannot hang the others.
      const uint64_t before = comm.counters().collectives;
      {
        NoGradGuard no_grad;
        m->quantize(x, comm);
      }
      m->eval();
      QuantizerOutput out = m->quantize(x, comm);
      CHECK(comm.counters().collectives == before);
      std::vector<int64_t> sizes = m->layer_sizes();
      // The layers options_for asks for: quantizers, groups, codebooks.
      const nlohmann::json& keys = quantizer_kind(type).test_keys;
      CHECK(sizes.size() == static_cast<size_t>(keys.value("num_quantizers", 1) * keys.value("groups", 1) *
                                                keys.value("num_codebooks", 1)));
      CHECK(m->dim() == kDim);
      CHECK(out.quantized.shape() == Shape{kRows, kDim});
      REQUIRE(out.indices.shape() == Shape{kRows, static_cast<int64_t>(sizes.size())});
      CHECK(out.active_layers == static_cast<int>(sizes.size()));  // eval never drops
      std::vector<int64_t> idx = out.indices.to_vector<int64_t>();
      for (size_t i = 0; i < idx.size(); ++i) CHECK((idx[i] >= 0 && idx[i] < sizes[i % sizes.size()]));
      double bits = 0;
      for (int64_t k : sizes) bits += std::log2(static_cast<double>(k));
      CHECK(m->bits() == bits);
      // The eval output is x + (code - x): within rounding of the codes.
      test::check_close({{"decoded", m->decode(out.indices)}}, {{"decoded", out.quantized.detach()}}, 1e-5, 1e-5);
      if (type.ends_with("fsq") || type.ends_with("lfq") || type.ends_with("sim_vq")) {
        Tensor mask = ones({kRows}, DType::i64);
        CHECK_THROWS_WITH_AS(m->quantize(x, comm, mask), doctest::Contains("takes no mask"), Error);
      }
    }, test::kFast);
  }
}

}  // namespace vqddp

namespace vqddp {
namespace {

// Options of vector-quantize-pytorch's VectorQuantize that add a random draw
// or a statistic over the batch, on vq and residual_vq.
std::vector<std::pair<std::string, QuantizerOptions>> option_variants() {
  std::vector<std::pair<std::string, QuantizerOptions>> out;
  for (const char* type : {"vq", "residual_vq"}) {
    // a Gumbel draw per row and code, from one shared stream per step
    out.emplace_back(std::string(type) + ", stochastic_sample_codes",
                     options_for(type, {{"stochastic_sample_codes", true}, {"sample_codebook_temp", 0.5}}));
    // statistics and revival only
    out.emplace_back(std::string(type) + ", ema_update false", options_for(type, {{"ema_update", false}}));
    // moments of the global batch, every step
    out.emplace_back(std::string(type) + ", affine_param", options_for(type, {{"affine_param", true}}));
  }
  // The options that draw noise (by global row), step codebooks inside the
  // forward or search per row.
  out.emplace_back("vq, directional_reparam",
                   options_for("vq", {{"learnable_codebook", true}, {"rotation_trick", false}, {"directional_reparam", true}}));
  out.emplace_back("residual_vq, diveq", options_for("residual_vq", {{"learnable_codebook", true}, {"diveq", true}}));
  const nlohmann::json inplace = {{"learnable_codebook", true}, {"in_place_codebook_optimizer", {{"type", "sgd"}, {"lr", 0.1}}}};
  out.emplace_back("vq, in_place_codebook_optimizer", options_for("vq", inplace));
  out.emplace_back("residual_vq, in_place_codebook_optimizer", options_for("residual_vq", inplace));
  nlohmann::json shared = inplace;
  shared["shared_codebook"] = true;
  out.emplace_back("residual_vq shared, in_place_codebook_optimizer", options_for("residual_vq", shared));
  out.emplace_back("residual_vq, beam_size, eval_beam_size",
                   options_for("residual_vq", {{"beam_size", 2}, {"eval_beam_size", 3}}));
  return out;
}

}  // namespace

TEST_CASE("VectorQuantize options that draw or reduce over the batch (stochastic_sample_codes, ema_update false, "
          "affine_param, directional_reparam, diveq, a shared in-place step, beam search): W ranks' "
          "outputs, indices and state are == 1 rank's, W = 2..3, every split") {
  for (const auto& [name, q] : option_variants()) {
    CAPTURE(name);
    check_w_ranks_equal_one(q);
  }
}

TEST_CASE("stochastic_sample_codes draws codes in training steps only: some rows leave their nearest code at "
          "temperature 1, none at temperature 0 or in eval") {
  auto chosen = [](float temperature, bool training) {
    QuantizerOptions q = options_for("vq", {{"kmeans_init", false},
                                            {"threshold_ema_dead_code", 0},
                                            {"rotation_trick", false},
                                            {"stochastic_sample_codes", true},
                                            {"sample_codebook_temp", temperature}});
    std::shared_ptr<Quantizer> m = make(q);
    m->train(training);
    Generator data(3);
    Tensor x = rand_normal({64, kDim}, data);
    SingleCommunicator comm;
    QuantizerOutput out = m->quantize(x, comm);
    std::shared_ptr<Quantizer> nearest = make(q);
    nearest->eval();
    Tensor near = nearest->quantize(x, comm).indices;  // the same initial codebook: make() draws it alike
    int64_t moved = 0;
    std::vector<int64_t> a = out.indices.to_vector<int64_t>(), b = near.to_vector<int64_t>();
    for (size_t i = 0; i < a.size(); ++i) moved += a[i] != b[i];
    return moved;
  };
  CHECK(chosen(1.f, true) > 8);
  CHECK(chosen(0.f, true) == 0);
  CHECK(chosen(1.f, false) == 0);
}

}  // namespace vqddp

namespace vqddp {

TEST_CASE("invariant 4 for every VectorQuantize option: after a training step, inference (eval, or no grad in "
          "training mode) issues no collective and changes no state") {
  std::vector<std::pair<std::string, QuantizerOptions>> all = option_variants();
  for (const char* type : {"vq", "residual_vq"}) {
    auto with = [&](const std::string& name, const nlohmann::json& keys) {
      all.emplace_back(std::string(type) + ", " + name, options_for(type, keys));
    };
    with("commitment_use_cross_entropy_loss", {{"commitment_use_cross_entropy_loss", true}});
    with("orthogonal_reg, learnable", {{"learnable_codebook", true},
                                       {"orthogonal_reg_weight", 1.0},
                                       {"orthogonal_reg_active_codes_only", true},
                                       {"orthogonal_reg_max_codes", 4}});
    nlohmann::json sync = {{"learnable_codebook", true}, {"sync_update_v", 0.5}};
    if (std::string(type) == "residual_vq") sync["quant_grad_frac"] = 0.5;
    with(std::string("sync_update_v") + (sync.contains("quant_grad_frac") ? ", quant_grad_frac" : ""), sync);
  }
  for (const auto& [name, q] : all) {
    CAPTURE(name);
    run_ranks(1, [&](Communicator& comm) {
      std::shared_ptr<Quantizer> m = make(q);
      Generator data(3);
      Tensor x = rand_normal({kRows, kDim}, data);
      m->train();
      m->quantize(x, comm);
      const NamedTensors state = m->state_copy();
      const uint64_t before = comm.counters().collectives;
      {
        NoGradGuard no_grad;
        m->quantize(x, comm);
      }
      m->eval();
      m->quantize(x, comm);
      CHECK(comm.counters().collectives == before);
      CHECK(test::first_difference(m->state_copy(), state) == "");
    }, test::kFast);
  }
}

TEST_CASE("straight_through follows the reference's rule: refused with the rotation trick, accepted without") {
  auto read = [](nlohmann::json j) {
    QuantizerOptions q;
    read_quantizer_options(ConfigSection(j, "quantizer", "run.json"), q);
    return q;
  };
  CHECK_THROWS_WITH_AS(read({{"type", "vq"}, {"straight_through", true}}),
                       doctest::Contains("'quantizer.straight_through' needs \"rotation_trick\": false"), Error);
  CHECK_NOTHROW(read({{"type", "vq"}, {"straight_through", true}, {"rotation_trick", false}}));
}

TEST_CASE("beam search keys: one weight per quantizer, a beam of 1..64, refused beside what it cannot score") {
  auto read = [](nlohmann::json j) {
    QuantizerOptions q;
    read_quantizer_options(ConfigSection(j, "quantizer", "run.json"), q);
    return q;
  };
  QuantizerOptions q = read({{"type", "residual_vq"}, {"num_quantizers", 3}, {"beam_size", 4},
                             {"beam_score_quantizer_weights", {1.0, 0.5, 0.25}}});
  CHECK(q.as<ResidualVQOptions>().beam_size == 4);
  CHECK(q.as<ResidualVQOptions>().beam_score_quantizer_weights == std::vector<float>{1.f, 0.5f, 0.25f});
  CHECK_THROWS_WITH_AS(read({{"type", "residual_vq"}, {"num_quantizers", 3}, {"beam_score_quantizer_weights", {1.0}}}),
                       doctest::Contains("'quantizer.beam_score_quantizer_weights' must hold one weight per quantizer (3), got 1"),
                       Error);
  CHECK_THROWS_WITH_AS(read({{"type", "residual_vq"}, {"beam_size", 0}}), doctest::Contains("'quantizer.beam_size'"), Error);
  CHECK_THROWS_WITH_AS(read({{"type", "residual_vq"}, {"beam_size", 2}, {"commitment_use_cross_entropy_loss", true}}),
                       doctest::Contains("does not go with"), Error);
  CHECK_THROWS_WITH_AS(read({{"type", "vq"}, {"beam_size", 2}}), doctest::Contains("unknown key 'quantizer.beam_size'"),
                       Error);
}

}  // namespace vqddp
