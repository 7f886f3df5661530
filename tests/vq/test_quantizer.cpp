// Every quantizer type through the Quantizer contract (vq/quantizer.h), made
// by the factory from options: the DDP invariants (W ranks == 1 rank on the
// whole batch, bit for bit, VQ_SEMANTICS.md section 7) hold through the
// interface for every type, and the contract's shapes, decode, layer sizes
// and bits say what they promise.
#include <doctest/doctest.h>

#include <cmath>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/streams.h"
#include "tests/vq/harness.h"
#include "tests/vq/quantizer_trace.h"
#include "vq/quantizer_options.h"

namespace vqddp {
namespace {

using test::for_each_split;
using test::per_rank;
using test::kDim;
using test::kRows;
using test::kSteps;
using test::kLayers;
using test::options_for;
using test::make;
using test::Trace;
using test::run;

}  // namespace

TEST_CASE("every quantizer type through the Quantizer interface: W ranks' outputs, indices, state and metrics are == 1 "
          "rank's "
          "on the whole batch, W = 2..3, every split") {
  for (const std::string& type : quantizer_types()) {
    CAPTURE(type);
    QuantizerOptions q = options_for(type);
    Trace one = per_rank(1, [&](Communicator& comm) { return run(q, comm, {kRows}); })[0];
    for_each_split(kRows, 2, 3, [&](int w, const std::string& split) {
      std::vector<int64_t> sizes = test::split_sizes(kRows, w, split);
      std::vector<Trace> ranks = per_rank(w, [&](Communicator& comm) { return run(q, comm, sizes); });
      // Invariants 1-2: every rank's state and metrics are the 1-rank ones.
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
      const bool grouped = type.starts_with("grouped_"), residual = grouped || type.starts_with("residual_");
      CHECK(sizes.size() == static_cast<size_t>((residual ? kLayers : 1) * (grouped ? 2 : 1)));
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
