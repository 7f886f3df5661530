// The VQ hot path and the section 7 invariants on one GPU, with W = 1..4
// rank threads (each on its own stream) over the thread backend.
//   assign:      indices equal the CPU's except where the two codes' scores
//                are within 1e-4 (relative): cuBLAS and OpenBLAS round the
//                dot products differently; at most 1% of rows may differ
//   code stats:  counts exact, sums within 1e-12 relative (float64)
//   EMA steps:   every rank's GPU state bitwise identical (invariant 1),
//                W ranks on even/uneven/empty splits equal 1 GPU rank within
//                1e-5 (invariant 2), the GPU equals the CPU within 1e-4 over
//                6 steps with revival, bitwise identical run to run
#include <algorithm>
#include <set>

#include "comm/single.h"
#include "comm/thread_group.h"
#include "engine/device.h"
#include "tests/cuda/gpu.h"
#include "tests/vq/harness.h"
#include "vq/assign.h"
#include "vq/code_stats.h"
#include "vq/codebook.h"
#include "vq/residual_vq.h"
#include "vq/vector_quantize.h"

using namespace vqddp;
using namespace vqddp::test;

namespace {

CodebookOptions book_options(bool cosine) {
  CodebookOptions o;
  o.codebook_size = 64;
  o.dim = 16;
  o.cosine = cosine;
  o.decay = 0.8f;
  o.threshold_ema_dead_code = 2.f;
  o.kmeans_iters = 5;
  o.seed = 5;
  return o;
}

std::vector<Tensor> batches(int steps, int64_t n, int64_t d) {
  std::vector<Tensor> out;
  for (int s = 0; s < steps; ++s) out.push_back(randn({s == 3 ? 0 : n, d}, 100 + s, 0.5f * s));  // step 3: empty
  return out;
}

struct Run {
  std::vector<std::vector<NamedTensors>> states;  // [rank][step], on the host
  std::vector<int64_t> revived;                   // rank 0, per step
};

// W ranks over `data` split by `kind`; `make` builds a rank's module on
// `device`, `step` runs one forward and returns the codes revived.
template <class Make, class Step>
Run run_steps(int w, const std::string& kind, const std::vector<Tensor>& data, Device device, Make make, Step step) {
  Run run;
  run.states.resize(w);
  run_ranks(w, [&](Communicator& comm) {
    auto module = make();
    module->to(device);
    for (const Tensor& x : data) {
      int64_t revived = step(*module, shard(x, split_sizes(x.size(0), w, kind), comm.rank()).to(device), comm);
      run.states[comm.rank()].push_back(host_state(*module));
      if (comm.rank() == 0) run.revived.push_back(revived);
    }
  }, kFast);
  return run;
}

Run train_codebook(const CodebookOptions& o, const std::vector<Tensor>& data, int w, const std::string& kind,
                   Device device) {
  return run_steps(
      w, kind, data, device, [&] { Generator init(1, 0); return std::make_unique<Codebook>(o, init); },
      [&](Codebook& book, const Tensor& x, Communicator& comm) {
        CodebookOutput out = book.forward(x, comm);
        CHECK(out.quantize.device() == device);
        return out.metrics.codes_revived;
      });
}

}  // namespace

TEST_CASE("assign on the GPU picks the CPU's codes, every row") {
  // The same fixed-order dots and the same (score, index) order on both:
  // no near-tie may differ.
  for (bool cosine : {false, true}) {
    CAPTURE(cosine);
    // N above one GPU row block for K = 8192 (2048 rows), D not a multiple of 32.
    Tensor x = randn({5000, 40}, 1), e = randn({8192, 40}, 2);
    if (cosine) {
      x = l2_normalize_rows(x);
      e = l2_normalize_rows(e);
    }
    CHECK(assign_codes(x.to(kGpu), e.to(kGpu), cosine).to_vector<int64_t>() ==
          assign_codes(x, e, cosine).to_vector<int64_t>());
  }
}

TEST_CASE("assign on the GPU breaks exact ties to the lowest index across warp lanes, like the CPU") {
  Tensor x = from_vector({1, 0, 1.1f, 0.1f, 0.9f, -0.1f}, {3, 2});
  CHECK(assign_codes(x.to(kGpu), tied_codebook().to(kGpu), false).to_vector<int64_t>() ==
        std::vector<int64_t>{35, 35, 35});
}

TEST_CASE("assign on the GPU: ties across 128-code tiles go to the lowest code, NaN codes are never chosen") {
  // Codes 35, 160 and 300 (three tiles of the fused kernel) are equally
  // near; code 10 is NaN and code 0 far. 300 rows cross the 128-row tiles.
  std::vector<float> e(400 * 2, 9.f);
  for (int j : {300, 160, 35}) {
    e[2 * j] = 1.f;
    e[2 * j + 1] = 0.f;
  }
  e[2 * 10] = NAN;
  Tensor book = from_vector(e, {400, 2});
  std::vector<float> xs;
  for (int r = 0; r < 300; ++r) {
    xs.push_back(1.f + 0.001f * (r % 7));
    xs.push_back(0.f);
  }
  Tensor x = from_vector(xs, {300, 2});
  std::vector<int64_t> cpu = assign_codes(x, book, false).to_vector<int64_t>();
  CHECK(cpu == std::vector<int64_t>(300, 35));
  CHECK(assign_codes(x.to(kGpu), book.to(kGpu), false).to_vector<int64_t>() == cpu);
}

TEST_CASE("code statistics on the GPU: exact counts, float64 sums, reproducible bitwise") {
  Tensor x = randn({3000, 24}, 3);
  std::vector<int64_t> idx(3000);
  for (int64_t i = 0; i < 3000; ++i) idx[i] = i < 1500 ? 7 : (i * 37) % 50;  // one crowded code, empty codes
  Tensor index = from_vector(idx, {3000});
  Tensor cpu = code_stats(x, index, 50);
  Tensor gpu1 = code_stats(x.to(kGpu), index.to(kGpu), 50), gpu2 = code_stats(x.to(kGpu), index.to(kGpu), 50);
  std::vector<double> c = cpu.to_vector<double>(), g = gpu1.to_vector<double>();
  for (int k = 0; k < 50; ++k) CHECK(g[k] == c[k]);
  for (size_t i = 50; i < c.size(); ++i) CHECK(std::abs(g[i] - c[i]) <= 1e-12 * std::max(1.0, std::abs(c[i])));
  CHECK(gpu1.to_vector<double>() == gpu2.to_vector<double>());
  Tensor bad = from_vector(std::vector<int64_t>{0, 50}, {2}).to(kGpu);
  CHECK_THROWS_WITH_AS(code_stats(x.slice_rows(0, 2).to(kGpu), bad, 50), doctest::Contains("out of range for 50 codes"), Error);
}

TEST_CASE("invariants 1 and 2 bitwise on one GPU: W = 1..4 rank threads, every split, Euclidean and cosine, with "
          "revival; the GPU's codebook state equals the CPU's") {
  for (bool cosine : {false, true}) {
    CAPTURE(cosine);
    CodebookOptions o = book_options(cosine);
    std::vector<Tensor> data = batches(6, 203, o.dim);
    Run cpu = train_codebook(o, data, 1, "even", kCpu);
    Run one = train_codebook(o, data, 1, "even", kGpu);
    CHECK(*std::max_element(one.revived.begin(), one.revived.end()) > 0);  // the revival path ran on the GPU
    CHECK(one.revived == cpu.revived);
    // The same fixed-order dots, float64 statistics and explicitly rounded EMA.
    for (size_t s = 0; s < data.size(); ++s) CHECK(first_difference(one.states[0][s], cpu.states[0][s]) == "");
    for (int w = 2; w <= 4; ++w)
      for (const std::string& kind : kSplitKinds) {
        CAPTURE(w);
        CAPTURE(kind);
        Run ranks = train_codebook(o, data, w, kind, kGpu);
        for (size_t s = 0; s < data.size(); ++s) {
          CAPTURE(s);
          for (int r = 1; r < w; ++r) CHECK(bitwise_equal(ranks.states[r][s], ranks.states[0][s]));  // invariant 1
          CHECK(first_difference(ranks.states[0][s], one.states[0][s]) == "");                   // invariant 2
        }
      }
    // Bitwise reproducible run to run.
    Run again = train_codebook(o, data, 3, "uneven", kGpu), first = train_codebook(o, data, 3, "uneven", kGpu);
    for (size_t s = 0; s < data.size(); ++s) CHECK(bitwise_equal(again.states[0][s], first.states[0][s]));
  }
}

TEST_CASE("Module::to moves a codebook's float state to the GPU and leaves its int64 counters on the host") {
  Generator init(1, 0);
  Codebook book(book_options(false), init);
  Tensor held = book.embed;
  book.to(kGpu);
  for (auto& [name, t] : book.named_buffers()) {
    CAPTURE(name);
    CHECK(t.device() == (t.dtype() == DType::i64 ? kCpu : kGpu));
  }
  CHECK(held.device() == kGpu);  // handles taken before the move follow it
}

TEST_CASE("eval on the GPU issues no collective (invariant 4) and changes nothing") {
  Generator init(1, 0);
  Codebook book(book_options(false), init);
  book.to(kGpu);
  SingleCommunicator comm;
  book.forward(randn({50, 16}, 5).to(kGpu), comm);  // k-means init
  book.eval();
  uint64_t before = comm.counters().collectives;
  NamedTensors state = host_state(book);
  book.forward(randn({50, 16}, 6).to(kGpu), comm);
  CHECK(comm.counters().collectives == before);
  CHECK(bitwise_equal(host_state(book), state));
}

TEST_CASE("a GPU codebook refuses a non-finite row naming rank, row and column, and changes nothing") {
  Generator init(1, 0);
  Codebook book(book_options(false), init);
  book.to(kGpu);
  SingleCommunicator comm;
  book.forward(randn({50, 16}, 4).to(kGpu), comm);  // initialised
  NamedTensors state = host_state(book);
  std::vector<float> v = randn({10, 16}, 7).to_vector<float>();
  v[3 * 16 + 5] = NAN;
  CHECK_THROWS_WITH_AS(book.forward(from_vector(v, {10, 16}).to(kGpu), comm), doctest::Contains("row 3"), Error);
  CHECK_THROWS_WITH_AS(book.forward(from_vector(v, {10, 16}).to(kGpu), comm), doctest::Contains("column 5"), Error);
  CHECK(bitwise_equal(host_state(book), state));
}

TEST_CASE("masked rows on the GPU: the CPU's indices (-1 where masked), inputs passed through, decode matches") {
  VectorQuantizeOptions o;
  o.dim = 8;
  o.codebook_size = 16;
  o.codebook.kmeans_iters = 3;
  Tensor x = randn({12, 8}, 8);
  Tensor mask = from_vector(std::vector<int64_t>{1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1}, {12});
  SingleCommunicator comm;
  auto run = [&](Device device) {
    Generator init(2, 0);
    VectorQuantize vq(o, init);
    vq.to(device);
    VectorQuantizeOutput out = vq.forward(x.to(device), comm, mask);
    vq.eval();
    VectorQuantizeOutput ev = vq.forward(x.to(device), comm, mask);
    return std::make_pair(out, vq.decode(ev.indices).to(kCpu));
  };
  auto [cpu, cpu_decoded] = run(kCpu);
  auto [gpu, gpu_decoded] = run(kGpu);
  CHECK(gpu.indices.device() == kGpu);
  CHECK(gpu.indices.to_vector<int64_t>() == cpu.indices.to_vector<int64_t>());
  check_matches(gpu.quantized, cpu.quantized, 1e-5, 1e-5);
  check_close({{"decode", gpu_decoded}}, {{"decode", cpu_decoded}}, 1e-5, 1e-5);
}

TEST_CASE("ResidualVQ with quantize dropout on one GPU: ranks agree bitwise, W ranks equal 1 rank") {
  ResidualVQOptions o;
  o.dim = 12;
  o.num_quantizers = 4;
  o.codebook_size = 32;
  o.codebook.kmeans_iters = 3;
  o.codebook.decay = 0.8f;
  o.quantize_dropout.enabled = true;
  o.seed = 9;
  std::vector<Tensor> data = batches(8, 150, o.dim);
  auto run = [&](int w, std::vector<std::vector<int>>& active) {
    active.assign(w, {});
    return run_steps(
        w, "even", data, kGpu, [&] { Generator init(2, 0); return std::make_unique<ResidualVQ>(o, init); },
        [&](ResidualVQ& rvq, const Tensor& x, Communicator& comm) {
          ResidualVQOutput out = rvq.forward(x, comm);
          active[comm.rank()].push_back(out.active_layers);
          return int64_t{0};
        });
  };
  std::vector<std::vector<int>> active_one, active;
  Run one = run(1, active_one);
  CHECK(std::set<int>(active_one[0].begin(), active_one[0].end()).size() > 1);  // dropout really varies
  for (int w = 2; w <= 4; ++w) {
    CAPTURE(w);
    Run ranks = run(w, active);
    for (int r = 0; r < w; ++r) CHECK(active[r] == active_one[0]);
    for (size_t s = 0; s < data.size(); ++s) {
      for (int r = 1; r < w; ++r) CHECK(bitwise_equal(ranks.states[r][s], ranks.states[0][s]));
      CHECK(first_difference(ranks.states[0][s], one.states[0][s]) == "");  // invariant 2, bitwise
    }
  }
}
