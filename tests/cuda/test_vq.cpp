// The VQ hot path and the section 7 invariants on one GPU, with W = 1..4
// rank threads (each on its own stream) over the thread backend.
//   assign:      the CPU's indices on every row (the same fixed-order dots
//                and (score, index) order), also across GPU row blocks
//   code stats:  counts exact, sums within 1e-12 relative (float64)
//   EMA steps:   every rank's GPU state bitwise identical (invariant 1),
//                W ranks on every split kind bitwise equal to 1 GPU rank
//                (invariant 2), the GPU bitwise equal to the CPU over 6 steps
//                with revival, bitwise identical run to run
#include <algorithm>
#include <set>

#include "comm/single.h"
#include "comm/thread_group.h"
#include "engine/device.h"
#include "tests/cuda/gpu.h"
#include "tests/vq/harness.h"
#include "tests/vq/quantizer_cases.h"
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

// One rank's run, in the shape check_traces_equal takes.
struct Trace {
  std::vector<NamedTensors> states;                   // after each step, on the host
  std::vector<std::vector<CodebookMetrics>> metrics;  // per step, per codebook updated
};

// W ranks over `data` split by `kind`, each rank's trace by rank; `make`
// builds a rank's module on `device`, `step` runs one forward and returns
// its metrics.
template <class Make, class Step>
std::vector<Trace> run_steps(int w, const std::string& kind, const std::vector<Tensor>& data, Device device, Make make,
                             Step step) {
  std::vector<Trace> traces(w);
  run_ranks(w, [&](Communicator& comm) {
    auto module = make();
    module->to(device);
    Trace& mine = traces[comm.rank()];
    for (const Tensor& x : data) {
      mine.metrics.push_back(step(*module, shard(x, split_sizes(x.size(0), w, kind), comm.rank()).to(device), comm));
      mine.states.push_back(host_state(*module));
    }
  }, kFast);
  return traces;
}

// Invariant 1 alone: every rank's state bitwise rank 0's after every step.
void check_ranks_identical(const std::vector<Trace>& ranks) {
  for (size_t s = 0; s < ranks[0].states.size(); ++s) {
    CAPTURE(s);
    for (size_t r = 1; r < ranks.size(); ++r) CHECK(bitwise_equal(ranks[r].states[s], ranks[0].states[s]));
  }
}

std::vector<Trace> train_codebook(const CodebookOptions& o, const std::vector<Tensor>& data, int w, const std::string& kind,
                   Device device) {
  return run_steps(
      w, kind, data, device, [&] { Generator init(1, 0); return std::make_unique<Codebook>(o, init); },
      [&](Codebook& book, const Tensor& x, Communicator& comm) {
        CodebookOutput out = book.forward(x, comm);
        CHECK(out.quantize.device() == device);
        return std::vector<CodebookMetrics>{out.metrics};
      });
}

}  // namespace

TEST_CASE("assign on the GPU picks the CPU's codes, every row") {
  // The same fixed-order dots and the same (score, index) order on both:
  // no near-tie may differ.
  for (bool cosine : {false, true}) {
    CAPTURE(cosine);
    // D not a multiple of 32; N = 5000 rows fit in one GPU row block (about
    // 2^24 / 64 tiles rows for K = 8192): the next test crosses blocks.
    Tensor x = randn({5000, 40}, 1), e = randn({8192, 40}, 2);
    if (cosine) {
      x = l2_normalize_rows(x);
      e = l2_normalize_rows(e);
    }
    CHECK(assign_codes(x.to(kGpu), e.to(kGpu), cosine).to_vector<int64_t>() ==
          assign_codes(x, e, cosine).to_vector<int64_t>());
  }
}

TEST_CASE("assign on the GPU over several row blocks: the whole batch's codes are the slices' codes, bitwise") {
  // K = 65536 codes make 512 tiles of 128, so a launch takes 2^24 / 512 =
  // 32768 rows (vq/device_vq.cpp): N = 70000 runs three row blocks, the last
  // partial, through the offsets x + r0 * D and out + r0. Each slice is under
  // one block, so it is assigned from offset 0; a row's code never depends on
  // its position in the batch, so the two must agree bit for bit.
  const int64_t n = 70000, k = 65536, d = 8;
  Tensor x = randn({n, d}, 11), e = randn({k, d}, 12);  // (N, D), (K, D)
  Tensor e_gpu = e.to(kGpu);
  std::vector<int64_t> whole = assign_codes(x.to(kGpu), e_gpu, false).to_vector<int64_t>();
  REQUIRE(static_cast<int64_t>(whole.size()) == n);
  std::vector<int64_t> sliced;
  for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 20000}, {20000, 50000}, {50000, n}}) {
    std::vector<int64_t> part = assign_codes(x.slice_rows(begin, end).to(kGpu), e_gpu, false).to_vector<int64_t>();
    sliced.insert(sliced.end(), part.begin(), part.end());
  }
  CHECK(whole == sliced);
  CHECK(std::set<int64_t>(whole.begin(), whole.end()).size() > 1000);  // real assignments, not one code everywhere
}

TEST_CASE("assign on the GPU breaks exact ties to the lowest index, like the CPU") {
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

TEST_CASE("code statistics on the GPU: exact counts, float64 sums, reproducible bitwise; on the grid the CPU's bits") {
  Tensor x = randn({3000, 24}, 3);
  std::vector<int64_t> idx(3000);
  for (int64_t i = 0; i < 3000; ++i) idx[i] = i < 1500 ? 7 : (i * 37) % 50;  // one crowded code, empty codes
  Tensor index = from_vector(idx, {3000});
  const StatsLayout layout{50, 24, 1};
  Tensor cpu = code_stats(x, index, layout, 0);
  Tensor gpu1 = code_stats(x.to(kGpu), index.to(kGpu), layout, 0), gpu2 = code_stats(x.to(kGpu), index.to(kGpu), layout, 0);
  std::vector<double> c = cpu.to_vector<double>(), g = gpu1.to_vector<double>();
  for (int k = 0; k < 50; ++k) CHECK(g[k] == c[k]);
  for (size_t i = 50; i < c.size(); ++i) CHECK(std::abs(g[i] - c[i]) <= 1e-12 * std::max(1.0, std::abs(c[i])));
  CHECK(gpu1.to_vector<double>() == gpu2.to_vector<double>());
  // On the exact-sum grid (the codebook's path) the chunked GPU sums are the
  // CPU's bits, and so is the grid's scale.
  Tensor grid_cpu = grid_scale({x}, nullptr), grid_gpu = grid_scale({x.to(kGpu)}, nullptr);
  CHECK(grid_gpu.to_vector<double>() == grid_cpu.to_vector<double>());
  CHECK(code_stats(x.to(kGpu), index.to(kGpu), layout, 0, grid_gpu).to_vector<double>() ==
        code_stats(x, index, layout, 0, grid_cpu).to_vector<double>());
  // Indices are the codebook's own (trusted, never read back): one outside
  // [0, K) (a masked row's -1) adds nothing, on both devices alike.
  Tensor outside = from_vector(std::vector<int64_t>{-1, 50}, {2});
  CHECK(code_stats(x.slice_rows(0, 2).to(kGpu), outside.to(kGpu), layout, 0).to_vector<double>() ==
        code_stats(x.slice_rows(0, 2), outside, layout, 0).to_vector<double>());
}

TEST_CASE("invariants 1 and 2 bitwise on one GPU: W = 1..4 rank threads, every split, Euclidean and cosine, with "
          "revival; the GPU's codebook state equals the CPU's") {
  for (bool cosine : {false, true}) {
    CAPTURE(cosine);
    CodebookOptions o = book_options(cosine);
    std::vector<Tensor> data = batches(6, 203, o.dim);
    std::vector<Trace> cpu = train_codebook(o, data, 1, "even", kCpu);
    std::vector<Trace> one = train_codebook(o, data, 1, "even", kGpu);
    int64_t revived = 0;
    for (const auto& m : one[0].metrics) revived = std::max(revived, m[0].codes_revived());
    CHECK(revived > 0);  // the revival path ran on the GPU
    // The same fixed-order dots, float64 statistics and explicitly rounded
    // EMA: the CPU's state and metrics, bitwise.
    check_traces_equal(one, cpu[0]);
    for_each_split(203, 2, 4, [&](int w, const std::string& split) {
      std::vector<Trace> ranks = train_codebook(o, data, w, split, kGpu);
      check_ranks_identical(ranks);      // invariant 1
      check_traces_equal(ranks, one[0]);  // invariant 2
    });
    // Bitwise reproducible run to run.
    std::vector<Trace> again = train_codebook(o, data, 3, "uneven", kGpu), first = train_codebook(o, data, 3, "uneven", kGpu);
    for (size_t s = 0; s < data.size(); ++s) CHECK(bitwise_equal(again[0].states[s], first[0].states[s]));
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

TEST_CASE("a GPU codebook refuses a non-finite row naming rank, row and column when its metrics are read, and "
          "changes nothing") {
  Generator init(1, 0);
  Codebook book(book_options(false), init);
  book.to(kGpu);
  SingleCommunicator comm;
  book.forward(randn({50, 16}, 4).to(kGpu), comm);  // initialised
  NamedTensors state = host_state(book);
  std::vector<float> v = randn({10, 16}, 7).to_vector<float>();
  v[3 * 16 + 5] = NAN;
  // The step does not wait to look: the flag travels with the statistics,
  // the update kernels skip the step, and reading the metrics throws.
  CodebookOutput out = book.forward(from_vector(v, {10, 16}).to(kGpu), comm);
  CHECK_THROWS_WITH_AS(out.metrics.perplexity(), doctest::Contains("rank 0: row 3"), NonFiniteError);
  CHECK_THROWS_WITH_AS(out.metrics.check(), doctest::Contains("(in column 5)"), NonFiniteError);
  // Every codebook tensor as it was. Only the shared-stream counter moved on:
  // the revival takes one stream per step before the device knows of the
  // flag, the same on every rank.
  NamedTensors after = host_state(book);
  for (NamedTensors* s : {&state, &after})
    std::erase_if(*s, [](const auto& named) { return named.first == "draws"; });
  CHECK(bitwise_equal(after, state));
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
    QuantizerOutput out = vq.quantize(x.to(device), comm, mask);
    vq.eval();
    QuantizerOutput ev = vq.quantize(x.to(device), comm, mask);
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
          QuantizerOutput out = rvq.quantize(x, comm);
          active[comm.rank()].push_back(out.active_layers);
          return out.metrics;
        });
  };
  std::vector<std::vector<int>> active_one, active;
  std::vector<Trace> one = run(1, active_one);
  CHECK(std::set<int>(active_one[0].begin(), active_one[0].end()).size() > 1);  // dropout really varies
  for (int w = 2; w <= 4; ++w) {
    CAPTURE(w);
    std::vector<Trace> ranks = run(w, active);
    for (int r = 0; r < w; ++r) CHECK(active[r] == active_one[0]);
    check_ranks_identical(ranks);      // invariant 1
    check_traces_equal(ranks, one[0]);  // invariant 2, bitwise
  }
}

TEST_CASE("every quantizer on the GPU: once initialised, a training step reads nothing back and never waits "
          "(W = 1 and 2 rank threads), and its state stays with the CPU's") {
  for (const Case& c : quantizer_cases()) {
    CAPTURE(c.name);
    for (int w : {1, 2}) {
      CAPTURE(w);
      std::vector<RankRun> gpu = run_case(c, kGpu, w, 4), cpu = run_case(c, kCpu, w, 4);
      for (int r = 0; r < w; ++r) {
        CAPTURE(r);
        for (size_t s = 1; s < gpu[r].counts.size(); ++s) {
          CAPTURE(s);
          CAPTURE(gpu[r].counts[s].str());
          CHECK((gpu[r].counts[s].to_host == 0) != c.reads_back);
          CHECK((gpu[r].counts[s].waits == 0) != c.reads_back);
        }
        // The codes are the CPU's (fixed-order GEMM); learnable weights see
        // cuBLAS's backward, so the state is held to a tolerance.
        check_close(gpu[r].state, cpu[r].state, 1e-3, 1e-5);
      }
    }
  }
}

