// The VQ hot path and the section 7 invariants on one GPU, with W = 1..4
// rank threads (each on its own stream) over the thread backend.
//   assign:      indices equal the CPU's except where the CPU's best and
//                second-best scores are within 1e-4 (relative): cuBLAS and
//                OpenBLAS round the dot products differently
//   code stats:  counts exact, sums within 1e-12 relative (float64)
//   EMA steps:   every rank's GPU state bitwise identical (invariant 1),
//                W ranks equal 1 GPU rank within 1e-5 (invariant 2), the GPU
//                equals the CPU within 1e-4 over 6 steps, bitwise identical
//                run to run
#include <algorithm>
#include <mutex>

#include "comm/single.h"
#include "comm/thread_group.h"
#include "engine/device.h"
#include "engine/random.h"
#include "tests/cuda/gpu.h"
#include "tests/vq/harness.h"
#include "vq/assign.h"
#include "vq/code_stats.h"
#include "vq/codebook.h"
#include "vq/residual_vq.h"

using namespace vqddp;
using namespace vqddp::test;

namespace {

Tensor randn(const Shape& s, uint64_t stream, float mean = 0.f) {
  Generator g(91, stream);
  return rand_normal(s, g, mean);
}

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

// Each rank's host state after every step, training on `device`.
std::vector<std::vector<NamedTensors>> train_codebook(const CodebookOptions& o, const std::vector<Tensor>& data, int w,
                                                      Device device) {
  std::vector<std::vector<NamedTensors>> states(w);
  run_ranks(w, [&](Communicator& comm) {
    Generator init(1, 0);
    Codebook book(o, init);
    book.to(device);
    for (const Tensor& x : data) {
      Tensor mine = shard(x, split_sizes(x.size(0), w, "uneven"), comm.rank()).to(device);
      CodebookOutput out = book.forward(mine, comm);
      CHECK(out.quantize.device() == device);
      states[comm.rank()].push_back(host_state(book));
    }
  }, kFast);
  return states;
}

}  // namespace

TEST_CASE("assign on the GPU picks the CPU's codes except at stated near-ties") {
  for (bool cosine : {false, true}) {
    CAPTURE(cosine);
    // N above one GPU row block for K = 8192 (2048 rows), D not a multiple of 32.
    Tensor x = randn({5000, 40}, 1), e = randn({8192, 40}, 2);
    if (cosine) {
      x = l2_normalize_rows(x);
      e = l2_normalize_rows(e);
    }
    std::vector<int64_t> cpu = assign_codes(x, e, cosine).to_vector<int64_t>();
    std::vector<int64_t> gpu = assign_codes(x.to(kGpu), e.to(kGpu), cosine).to_vector<int64_t>();
    // Scores of both choices, in double on the host.
    std::vector<float> px = x.to_vector<float>(), pe = e.to_vector<float>();
    auto score = [&](int64_t r, int64_t c) {
      double dot = 0, norm = 0;
      for (int j = 0; j < 40; ++j) {
        dot += double(px[r * 40 + j]) * pe[c * 40 + j];
        norm += double(pe[c * 40 + j]) * pe[c * 40 + j];
      }
      return cosine ? -dot : norm - 2 * dot;
    };
    int64_t differ = 0;
    for (size_t r = 0; r < cpu.size(); ++r) {
      if (cpu[r] == gpu[r]) continue;
      ++differ;
      double a = score(r, cpu[r]), b = score(r, gpu[r]);
      CHECK(std::abs(a - b) <= 1e-4 * std::max(1.0, std::abs(a)));
    }
    MESSAGE("rows assigned differently (near-ties): " << differ << " of " << cpu.size());
  }
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
  CHECK_THROWS_WITH_AS(code_stats(x.slice_rows(0, 2).to(kGpu), bad, 50), doctest::Contains("outside codebook"), Error);
}

TEST_CASE("invariants 1 and 2 on one GPU: W = 1..4 rank threads, Euclidean and cosine") {
  for (bool cosine : {false, true}) {
    CAPTURE(cosine);
    CodebookOptions o = book_options(cosine);
    std::vector<Tensor> data = batches(6, 203, o.dim);
    auto cpu = train_codebook(o, data, 1, kCpu)[0];
    auto one = train_codebook(o, data, 1, kGpu)[0];
    for (size_t s = 0; s < data.size(); ++s) check_close(one[s], cpu[s], 1e-4, 1e-5);
    for (int w = 2; w <= 4; ++w) {
      CAPTURE(w);
      auto ranks = train_codebook(o, data, w, kGpu);
      for (size_t s = 0; s < data.size(); ++s) {
        CAPTURE(s);
        for (int r = 1; r < w; ++r) CHECK(bitwise_equal(ranks[r][s], ranks[0][s]));  // invariant 1
        check_close(ranks[0][s], one[s], 1e-5, 1e-5);                              // invariant 2
      }
    }
    // Bitwise reproducible run to run.
    auto again = train_codebook(o, data, 3, kGpu);
    auto first = train_codebook(o, data, 3, kGpu);
    for (size_t s = 0; s < data.size(); ++s) CHECK(bitwise_equal(again[0][s], first[0][s]));
  }
}

TEST_CASE("a GPU codebook refuses a non-finite row naming rank, row and column") {
  Generator init(1, 0);
  Codebook book(book_options(false), init);
  book.to(kGpu);
  Tensor x = randn({10, 16}, 4);
  std::vector<float> v = x.to_vector<float>();
  v[3 * 16 + 5] = NAN;
  SingleCommunicator comm;
  CHECK_THROWS_WITH_AS(book.forward(from_vector(v, {10, 16}).to(kGpu), comm), doctest::Contains("row 3"), Error);
  CHECK_FALSE(book.initted());  // nothing changed
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
  std::vector<Tensor> data = batches(5, 150, o.dim);
  auto run = [&](int w) {
    std::vector<std::vector<NamedTensors>> states(w);
    std::vector<std::vector<int>> active(w);
    run_ranks(w, [&](Communicator& comm) {
      Generator init(2, 0);
      ResidualVQ rvq(o, init);
      rvq.to(kGpu);
      for (const Tensor& x : data) {
        Tensor mine = shard(x, split_sizes(x.size(0), w, "even"), comm.rank()).to(kGpu);
        ResidualVQOutput out = rvq.forward(mine, comm);
        active[comm.rank()].push_back(out.active_layers);
        states[comm.rank()].push_back(host_state(rvq));
      }
    }, kFast);
    for (int r = 1; r < w; ++r) CHECK(active[r] == active[0]);
    return states;
  };
  auto one = run(1);
  for (int w = 2; w <= 4; ++w) {
    CAPTURE(w);
    auto ranks = run(w);
    for (size_t s = 0; s < data.size(); ++s) {
      for (int r = 1; r < w; ++r) CHECK(bitwise_equal(ranks[r][s], ranks[0][s]));
      check_close(ranks[0][s], one[0][s], 1e-4, 1e-5);
    }
  }
}
