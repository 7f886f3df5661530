// ResidualVQ and ResidualFSQ: rank-synchronised quantize dropout, the
// no-grad validation hang made impossible, DDP equivalence, decoding.
#include <doctest/doctest.h>

#include <set>

#include "comm/single.h"
#include "engine/autograd.h"
#include "tests/vq/harness.h"
#include "vq/residual_fsq.h"
#include "vq/assign.h"
#include "vq/beam_search.h"
#include "vq/residual_vq.h"

using namespace vqddp;
using namespace vqddp::test;

namespace {

ResidualVQOptions rvq_options(bool dropout, bool shared = false) {
  ResidualVQOptions o;
  o.dim = 6;
  o.num_quantizers = 4;
  o.codebook_size = 8;
  o.shared_codebook = shared;
  o.quantize_dropout = {dropout, 1, 1, std::nullopt};
  o.codebook.kmeans_iters = 3;
  o.codebook.threshold_ema_dead_code = 0.5f;
  o.codebook.decay = 0.8f;
  o.seed = 5;
  return o;
}

ResidualFSQOptions rfsq_options() {
  ResidualFSQOptions o;
  o.levels = {8, 5, 5};
  o.num_quantizers = 5;
  o.dim = 4;
  o.quantize_dropout = {true, 0, 1, std::nullopt};
  o.seed = 9;
  return o;
}

// Which layers ran in each row of indices (N, Q): the count of the first
// row's non-negative entries (all rows agree without masks).
int active_of(const Tensor& indices) {
  int q = static_cast<int>(indices.size(1)), a = 0;
  if (indices.size(0) == 0) return -1;
  for (int l = 0; l < q; ++l) a += indices.data<int64_t>()[l] >= 0;
  return a;
}

}  // namespace

TEST_CASE("quantize dropout: the same index on every rank at every step, W = 1..4, with zero collectives spent on "
          "choosing it (ResidualFSQ issues none at all)") {
  for (int w = 1; w <= 4; ++w) {
    CAPTURE(w);
    std::vector<std::vector<int>> chosen(w);
    run_ranks(w, [&](Communicator& comm) {
      Generator init(0, 0), data(7, comm.rank());  // different data on every rank
      ResidualFSQ rfsq(rfsq_options(), init);
      for (int step = 0; step < 40; ++step) {
        QuantizerOutput out = rfsq.quantize(rand_normal({3 + comm.rank(), 4}, data), comm);
        chosen[comm.rank()].push_back(out.active_layers);
        CHECK(active_of(out.indices) == out.active_layers);
      }
      // No collective by construction: ResidualFSQ::forward takes no
      // communicator, so ranks agree only through the shared dropout stream.
    }, kFast);
    for (int r = 1; r < w; ++r) CHECK(chosen[r] == chosen[0]);
    std::set<int> distinct(chosen[0].begin(), chosen[0].end());
    CHECK(distinct.size() > 2);  // dropout really varies
  }
}

TEST_CASE("quantize dropout in ResidualVQ: identical layers on every rank, and exactly two all-reduces per active "
          "layer per step (the exact-sum grid's maximum, then the statistics)") {
  ResidualVQOptions o = rvq_options(true);
  o.codebook.kmeans_init = false;
  o.codebook.threshold_ema_dead_code = 0;
  std::vector<std::vector<int>> chosen(3);
  run_ranks(3, [&](Communicator& comm) {
    Generator init(0, 0), data(3, comm.rank());
    ResidualVQ rvq(o, init);
    for (int step = 0; step < 20; ++step) {
      uint64_t before = comm.counters().collectives;
      QuantizerOutput out = rvq.quantize(rand_normal({5, 6}, data), comm);
      chosen[comm.rank()].push_back(out.active_layers);
      CHECK(comm.counters().collectives - before == 2 * static_cast<uint64_t>(out.active_layers));
      CHECK(out.active_layers >= 2);  // cutoff index 1
    }
  }, kFast);
  CHECK(chosen[1] == chosen[0]);
  CHECK(chosen[2] == chosen[0]);
  CHECK(std::set<int>(chosen[0].begin(), chosen[0].end()).size() > 1);  // dropout really varies
}

TEST_CASE("the users' hang: a no-grad validation pass on only some ranks of a training-mode model issues no "
          "collective and completes; training then continues in step") {
  run_ranks(3, [&](Communicator& comm) {
    Generator init(0, 0), data(4, comm.rank());
    ResidualVQ rvq(rvq_options(true), init);
    ResidualFSQ rfsq(rfsq_options(), init);
    rvq.quantize(rand_normal({8, 6}, data), comm);  // training step: k-means init etc.
    rfsq.quantize(rand_normal({8, 4}, data), comm);
    uint64_t before = comm.counters().collectives;
    NamedTensors state = snapshot(rvq);
    if (comm.rank() != 1) {  // rank 1 skips validation
      NoGradGuard no_grad;
      for (int i = 0; i < 3; ++i) {
        QuantizerOutput v = rvq.quantize(rand_normal({8, 6}, data), comm);
        CHECK(v.active_layers == 4);  // validation never drops
        CHECK(rfsq.quantize(rand_normal({8, 4}, data), comm).active_layers == 5);
      }
    }
    CHECK(comm.counters().collectives == before);
    CHECK(bitwise_equal(snapshot(rvq), state));
    // The dropout streams did not move, so the next training step agrees.
    QuantizerOutput next = rvq.quantize(rand_normal({8, 6}, data), comm);
    std::vector<int64_t> all = all_gather_counts(comm, next.active_layers);
    for (int64_t a : all) CHECK(a == next.active_layers);
  }, kFast);
}

TEST_CASE("ResidualVQ bitwise: after steps with k-means init, revival and dropout every rank's state is == 1 rank's "
          "on the whole batch (separate and shared codebooks, with and without project_in; W = 2..5, every split "
          "kind; with beam search on two of the four)") {
  for (bool shared : {false, true})
    for (int64_t codebook_dim : {0, 4}) {  // 4: project_in 6 -> 4 before the first layer
      CAPTURE(shared);
      CAPTURE(codebook_dim);
      ResidualVQOptions o = rvq_options(true, shared);
      o.codebook_dim = codebook_dim;
      o.beam_size = shared == (codebook_dim == 4) ? 3 : 1;  // the search is row-local: any split gives its paths
      CAPTURE(o.beam_size);
      // Near the mean rows per code (30 rows, or up to 4 x 30 shared, for 8
      // codes), so revival fires.
      o.codebook.threshold_ema_dead_code = shared ? 8.f : 2.5f;
      std::vector<Tensor> batches;
      Generator data(8, 0);
      for (int s = 0; s < 5; ++s) batches.push_back(rand_normal({30, 6}, data));
      struct Run {
        std::vector<NamedTensors> states;                  // after each step
        std::vector<std::vector<CodebookMetrics>> metrics;  // per step, per layer that ran
        std::vector<int> active;                            // per step
      };
      auto run = [&](int w, const std::string& split, Device device) {
        std::vector<Run> runs(w);
        run_ranks(w, [&](Communicator& comm) {
          Generator init(0, 0);
          ResidualVQ rvq(o, init);
          rvq.to(device);
          for (int l = 0; l < o.num_quantizers; ++l) CHECK_FALSE(rvq.codebook(l).initted());
          Run& mine = runs[comm.rank()];
          for (auto& x : batches) {
            QuantizerOutput out = rvq.quantize(shard(x, split_sizes(30, w, split), comm.rank()).to(device), comm);
            mine.states.push_back(snapshot(rvq));
            mine.metrics.push_back(out.metrics);
            mine.active.push_back(out.active_layers);
          }
          for (int l = 0; l < o.num_quantizers; ++l) CHECK(rvq.codebook(l).initted());  // k-means in step 0
        }, kFast);
        return runs;
      };
      Run one = run(1, "even", Device::cpu())[0];
      int64_t revived_first = 0, revived_later = 0;
      for (size_t s = 0; s < batches.size(); ++s)
        for (const CodebookMetrics& m : one.metrics[s]) (s == 0 ? revived_first : revived_later) += m.codes_revived();
      CHECK(revived_first > 0);  // init and revival in the same step
      CHECK(revived_later > 0);
      CHECK(std::set<int>(one.active.begin(), one.active.end()).size() > 1);  // dropout varies the layers
      check_traces_equal(run(1, "even", Device::sim()), one);
      // Empty ranks: the shared codebook's concat of no rows. On sim as on the CPU.
      for (Device device : kTestDevices) {
        CAPTURE(device.str());
        for_each_split(30, 2, 5, [&](int w, const std::string& split) {
          std::vector<Run> runs = run(w, split, device);
          check_traces_equal(runs, one);
          for (int r = 0; r < w; ++r) CHECK(runs[r].active == one.active);
        });
      }
    }
}

TEST_CASE("ResidualVQ: residuals shrink layer by layer; losses and indices have the stated shapes") {
  SingleCommunicator comm;
  Generator init(0, 0), data(9, 0);
  ResidualVQOptions o = rvq_options(false);
  o.codebook_sizes = {16, 8, 8, 4};
  o.codebook_dim = 3;  // with projections
  ResidualVQ rvq(o, init);
  Tensor x = rand_normal({64, 6}, data);
  for (int i = 0; i < 3; ++i) rvq.quantize(x, comm);
  QuantizerOutput out = rvq.quantize(x, comm);
  CHECK(out.indices.shape() == Shape{64, 4});
  CHECK(out.layer_losses.size() == 4);
  CHECK(out.metrics.size() == 4);
  CHECK(rvq.codebook(0).options().codebook_size == 16);
  CHECK(rvq.codebook(3).options().codebook_size == 4);
  CHECK(out.layer_losses[1].item<float>() < out.layer_losses[0].item<float>());
  float total = 0;
  for (auto& l : out.layer_losses) total += l.item<float>();
  CHECK(out.loss.item<float>() == doctest::Approx(total));
}

TEST_CASE("decode(indices) equals the forward output in eval, also with dropped layers (-1)") {
  SingleCommunicator comm;
  Generator init(0, 0), data(10, 0);
  ResidualVQOptions o = rvq_options(false);
  o.codebook_dim = 4;
  ResidualVQ rvq(o, init);
  Tensor x = rand_normal({20, 6}, data);
  rvq.quantize(x, comm);
  rvq.eval();
  QuantizerOutput out = rvq.quantize(x, comm);
  check_close({{"d", rvq.decode(out.indices)}}, {{"d", out.quantized}}, 1e-5, 1e-5);
  Tensor dropped = out.indices.clone();
  for (int64_t i = 0; i < 20; ++i) dropped.data<int64_t>()[i * 4 + 3] = -1;
  std::vector<Tensor> codes = rvq.get_codes_from_indices(dropped);
  CHECK(sum(square(codes[3])).item<float>() == 0.f);

  ResidualFSQ rfsq(rfsq_options(), init);
  rfsq.eval();
  QuantizerOutput f = rfsq.quantize(rand_normal({12, 4}, data), comm);
  check_close({{"d", rfsq.decode(f.indices)}}, {{"d", f.quantized}}, 1e-5, 1e-5);
}

TEST_CASE("ResidualVQ with masks: masked rows get -1 in every layer and pass their input through") {
  SingleCommunicator comm;
  Generator init(0, 0), data(11, 0);
  ResidualVQ rvq(rvq_options(false), init);
  Tensor x = rand_normal({6, 6}, data);
  Tensor mask = from_vector(std::vector<int64_t>{1, 0, 1, 1, 0, 1}, {6});
  QuantizerOutput out = rvq.quantize(x, comm, mask);
  for (int l = 0; l < 4; ++l) {
    CHECK(out.indices.data<int64_t>()[1 * 4 + l] == -1);
    CHECK(out.indices.data<int64_t>()[0 * 4 + l] >= 0);
  }
  CHECK(slice_rows(out.quantized, 4, 5).to_vector<float>() == slice_rows(x, 4, 5).to_vector<float>());
}

TEST_CASE("a learnable ResidualVQ codebook gets a gradient in every active layer") {
  SingleCommunicator comm;
  Generator init(0, 0), data(12, 0);
  ResidualVQOptions o = rvq_options(false);
  o.codebook.learnable = true;
  ResidualVQ rvq(o, init);
  Tensor x = rand_normal({16, 6}, data);
  rvq.quantize(x, comm);  // k-means init
  QuantizerOutput out = rvq.quantize(x, comm);
  out.loss.backward();
  for (auto& [name, p] : rvq.named_parameters()) {
    CAPTURE(name);
    REQUIRE(p.grad().defined());
    CHECK(sum(square(p.grad())).item<float>() > 0.f);
  }
}

TEST_CASE("the first training step runs every layer, so dropout never leaves a codebook uninitialised") {
  SingleCommunicator comm;
  Generator init(0, 0), data(13, 0);
  ResidualVQ rvq(rvq_options(true), init);
  QuantizerOutput first = rvq.quantize(rand_normal({12, 6}, data), comm);
  CHECK(first.active_layers == 4);
  for (int l = 0; l < 4; ++l) CHECK(rvq.codebook(l).initted());
  rvq.eval();
  CHECK(rvq.quantize(rand_normal({12, 6}, data), comm).active_layers == 4);
}

TEST_CASE("quant_grad_frac: the share of a later layer's gradient that flows back through the earlier layers' output "
          "(0: none, 1: all, which cancels the straight-through path of layer 1's loss to the input)") {
  auto grad = [](float frac) {
    Generator init(0, 0), data(3, 0);
    ResidualVQOptions o;
    o.dim = 4;
    o.codebook_size = 8;
    o.num_quantizers = 2;
    o.codebook.kmeans_init = false;
    o.rotation_trick = false;
    o.quant_grad_frac = frac;
    ResidualVQ rvq(o, init);
    SingleCommunicator comm;
    Tensor x = rand_normal({6, 4}, data);
    x.set_requires_grad(true);
    rvq.quantize(x, comm).layer_losses[1].backward();  // layer 1's commitment loss alone
    return x.grad().to_vector<float>();
  };
  const std::vector<float> none = grad(0.f), half = grad(0.5f), all = grad(1.f);
  double norm = 0;
  for (size_t i = 0; i < none.size(); ++i) {
    norm += std::fabs(none[i]);
    CHECK(half[i] == doctest::Approx(0.5 * none[i]).epsilon(1e-4).scale(1e-6));
    CHECK(all[i] == doctest::Approx(0.0).scale(1e-6));
  }
  CHECK(norm > 0);
}

TEST_CASE("a shared ResidualVQ codebook takes one EMA step per layer, in layer order (the reference's dynamics)") {
  // cluster_size after one step: d^L cs0 + (1 - d) sum_l d^(L-1-l) n_l, with
  // n_l the code's count in layer l; embed_avg alike with the layers' sums.
  Generator init(0, 0), data(4, 0);
  SingleCommunicator comm;
  ResidualVQOptions o = rvq_options(false, true);
  o.codebook.kmeans_init = false;
  o.codebook.threshold_ema_dead_code = 0.f;
  ResidualVQ rvq(o, init);
  const Codebook& book = rvq.codebook(0);
  std::vector<float> cs0 = book.cluster_size.to_vector<float>();
  const int64_t k = o.codebook_size, n = 40;
  QuantizerOutput out = rvq.quantize(rand_normal({n, o.dim}, data), comm);
  std::vector<int64_t> idx = out.indices.to_vector<int64_t>();
  std::vector<float> cs = book.cluster_size.to_vector<float>();
  const double d = o.codebook.decay;
  for (int64_t c = 0; c < k; ++c) {
    double expect = cs0[c];
    for (int l = 0; l < o.num_quantizers; ++l) {
      int64_t count = 0;
      for (int64_t r = 0; r < n; ++r) count += idx[r * o.num_quantizers + l] == c;
      expect = d * expect + (1 - d) * static_cast<double>(count);
    }
    CHECK(cs[c] == doctest::Approx(expect).epsilon(1e-5));
  }
}

TEST_CASE("beam search keeps the path of lowest summed weighted error where greedy takes the nearest code") {
  // One row, width 1. Greedy: 1.0 (error 0.2025), then -0.9 for the residual
  // -0.45 (0.2025): 0.405. The beam keeps 0 (0.3025) and then 0.55 fits
  // exactly: 0.3025. With the second layer weighted 0.1 greedy's path wins.
  Tensor z = from_vector(std::vector<float>{0.55f}, {1, 1});
  std::vector<Tensor> books = {from_vector(std::vector<float>{0.f, 1.f}, {2, 1}),
                               from_vector(std::vector<float>{0.55f, -0.9f}, {2, 1})};
  BeamSearchOptions o;
  o.weights = {1.f, 1.f};
  CHECK(beam_search(z, books, o).to_vector<int64_t>() == std::vector<int64_t>{0, 0});
  o.weights = {1.f, 0.1f};
  CHECK(beam_search(z, books, o).to_vector<int64_t>() == std::vector<int64_t>{1, 1});
}

TEST_CASE("ResidualVQ with beam_size: lower summed error than greedy on the same codebooks, the same codes in eval "
          "with eval_beam_size, and the EMA update from the chosen paths") {
  Generator data(6, 0);
  SingleCommunicator comm;
  Tensor x = rand_normal({200, 6}, data);
  auto trained = [&](int beam) {
    ResidualVQOptions o = rvq_options(false);
    o.codebook.threshold_ema_dead_code = 0.f;
    o.beam_size = beam;
    Generator init(0, 0);
    auto rvq = std::make_shared<ResidualVQ>(o, init);
    rvq->quantize(x, comm);  // the k-means step: greedy either way
    return rvq;
  };
  auto greedy = trained(1), beam = trained(4);
  CHECK(bitwise_equal(snapshot(*greedy), snapshot(*beam)));  // the first step did not search
  // Summed per-layer squared error over the path: the beam's is never larger per row.
  auto error = [&](ResidualVQ& rvq) {
    rvq.eval();
    QuantizerOutput out = rvq.quantize(x, comm);
    std::vector<Tensor> codes = rvq.get_codes_from_indices(out.indices);
    std::vector<float> px = x.to_vector<float>();
    std::vector<double> per_row(200, 0.0);
    std::vector<float> residual = px;
    for (const Tensor& c : codes) {
      std::vector<float> pc = c.to_vector<float>();
      for (int64_t i = 0; i < 200 * 6; ++i) {
        per_row[i / 6] += std::pow(double(pc[i]) - residual[i], 2) / 6;
        residual[i] -= pc[i];
      }
    }
    return std::make_pair(per_row, out.indices.to_vector<int64_t>());
  };
  auto [greedy_err, greedy_idx] = error(*greedy);
  auto [beam_err, beam_idx] = error(*beam);  // eval_beam_size 0: the training beam
  int better = 0;
  for (int64_t r = 0; r < 200; ++r) {
    CHECK(beam_err[r] <= greedy_err[r] + 1e-9);
    better += beam_err[r] < greedy_err[r] - 1e-9;
  }
  CHECK(better > 0);
  CHECK(greedy_idx != beam_idx);
  // A training step with the beam: the codebooks move by the chosen paths' rows.
  beam->train();
  greedy->train();
  beam->quantize(x, comm);
  greedy->quantize(x, comm);
  CHECK_FALSE(bitwise_equal(snapshot(*greedy), snapshot(*beam)));
}

TEST_CASE("in_place_codebook_optimizer on ResidualVQ: a shared codebook steps once, after the last layer, for the sum "
          "of the layers' mse(codes, residual); separate codebooks step per layer and assign again") {
  SingleCommunicator comm;
  Generator data(2, 0);
  Tensor x = rand_normal({20, 6}, data);
  const std::vector<float> xs = x.to_vector<float>();
  ResidualVQOptions o = rvq_options(false, true);
  o.num_quantizers = 2;
  o.codebook.learnable = true;
  o.codebook.kmeans_init = false;
  o.in_place_codebook_lr = 0.5f;
  Generator init(0, 0);
  ResidualVQ rvq(o, init);
  const Tensor& embed = rvq.codebook(0).embed;
  const std::vector<float> e0 = embed.to_vector<float>();
  QuantizerOutput out = rvq.quantize(x, comm);
  const std::vector<int64_t> idx = out.indices.to_vector<int64_t>();  // (20, 2), from the codebook before the step
  // Layer 0's residual is x, layer 1's x - e0[idx0]; each layer's loss is a mean over its 20 x 6 elements.
  std::vector<double> grad(e0.size(), 0.0);
  for (int n = 0; n < 20; ++n) {
    const int64_t k0 = idx[n * 2], k1 = idx[n * 2 + 1];
    for (int j = 0; j < 6; ++j) {
      const double r0 = xs[n * 6 + j], r1 = r0 - e0[k0 * 6 + j];
      grad[k0 * 6 + j] += 2 * (e0[k0 * 6 + j] - r0) / 120;
      grad[k1 * 6 + j] += 2 * (e0[k1 * 6 + j] - r1) / 120;
    }
  }
  const std::vector<float> e1 = embed.to_vector<float>();
  for (size_t i = 0; i < e0.size(); ++i) CHECK(e1[i] == doctest::Approx(e0[i] - 0.5 * grad[i]).epsilon(1e-5));
  // Separate codebooks: layer 0 steps, then its rows are assigned to the stepped codes.
  o.shared_codebook = false;
  Generator init2(0, 0);
  ResidualVQ separate(o, init2);
  QuantizerOutput s = separate.quantize(x, comm);
  const Tensor& layer0 = separate.codebook(0).embed;
  CHECK(s.indices.to_vector<int64_t>()[0] == assign_codes(x.slice_rows(0, 1), layer0.detach(), false).item<int64_t>());
}

TEST_CASE("ResidualVQ diveq: the output keeps |sum of codes - x| along a noised direction, no commitment term, and the "
          "gradient reaches the input and every layer's learnable codebook") {
  SingleCommunicator comm;
  Generator data(3, 0), init(0, 0);
  ResidualVQOptions o = rvq_options(false);
  o.num_quantizers = 3;
  o.codebook.learnable = true;
  o.codebook.kmeans_init = false;
  o.diveq = true;
  ResidualVQ rvq(o, init);
  Tensor x = rand_normal({16, 6}, data);
  x.set_requires_grad(true);
  QuantizerOutput out = rvq.quantize(x, comm);
  CHECK(out.loss.item<float>() == 0.f);
  std::vector<Tensor> codes = rvq.get_codes_from_indices(out.indices);
  const std::vector<float> xs = x.to_vector<float>(), q = out.quantized.to_vector<float>();
  std::vector<float> sum(16 * 6, 0.f);
  for (const Tensor& c : codes) {
    std::vector<float> pc = c.to_vector<float>();
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += pc[i];
  }
  for (int r = 0; r < 16; ++r) {
    double want = 0, got = 0, off = 0;
    for (int j = 0; j < 6; ++j) {
      want += std::pow(double(sum[r * 6 + j]) - xs[r * 6 + j], 2);
      got += std::pow(double(q[r * 6 + j]) - xs[r * 6 + j], 2);
      off += std::pow(double(q[r * 6 + j]) - sum[r * 6 + j], 2);
    }
    CHECK(std::sqrt(got) == doctest::Approx(std::sqrt(want)).epsilon(1e-4));
    CHECK(off > 0);  // the noise moved the direction
  }

  ::vqddp::sum(out.quantized).backward();
  for (int l = 0; l < 3; ++l) {
    double g = 0;
    for (float v : rvq.codebook(l).embed.grad().to_vector<float>()) g += std::fabs(v);
    CHECK(g > 0);
  }
  double gx = 0;
  for (float v : x.grad().to_vector<float>()) gx += std::fabs(v);
  CHECK(gx > 0);
}
