// The EMA codebook against docs/design.md section 7, invariant by invariant,
// and against the numpy golden files.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <numeric>

#include "comm/rank_order.h"
#include "comm/single.h"
#include "engine/autograd.h"
#include "engine/core/safetensors.h"
#include "engine/core/streams.h"
#include "vq/kmeans.h"
#include "vq/sampler.h"
#include "vq/losses.h"
#include "tests/vq/harness.h"
#include "vq/assign.h"
#include "vq/code_stats.h"
#include "vq/codebook.h"
#include "vq/vector_quantize.h"

using namespace vqddp;
using namespace vqddp::test;

namespace {

CodebookOptions ddp_options(bool cosine) {
  CodebookOptions o;
  o.codebook_size = 16;
  o.dim = 6;
  o.cosine = cosine;
  o.decay = 0.8f;
  o.threshold_ema_dead_code = 2.f;
  o.kmeans_init = true;
  o.kmeans_iters = 5;
  o.seed = 11;
  return o;
}

// Steps of global batches with shifted means so codes die and get revived.
std::vector<Tensor> make_batches(int steps, int64_t n, int64_t d) {
  Generator g(123, 0);
  std::vector<Tensor> out;
  for (int s = 0; s < steps; ++s) {
    Tensor shift = rand_normal({d}, g, 0.f, 2.f);
    out.push_back(add(rand_normal({s == 2 ? 0 : n, d}, g), shift));  // step 2 is empty everywhere
  }
  return out;
}

struct Trace {
  std::vector<NamedTensors> states;  // after each step
  std::vector<CodebookMetrics> metrics;
  std::vector<bool> initted_before;  // per step
};

// Runs the steps on W ranks with the given split; returns rank r's trace.
std::vector<Trace> run_codebook(const CodebookOptions& o, const std::vector<Tensor>& batches, int w,
                                const std::string& split, Device device = Device::cpu()) {
  std::vector<Trace> traces(w);
  run_ranks(w, [&](Communicator& comm) {
    Generator init(1, 0);
    Codebook book(o, init);
    book.to(device);
    Trace& t = traces[comm.rank()];
    for (const Tensor& x : batches) {
      std::vector<int64_t> sizes = split_sizes(x.size(0), w, split);
      t.initted_before.push_back(book.initted());
      CodebookOutput out = book.forward(shard(x, sizes, comm.rank()).to(device), comm);
      t.states.push_back(snapshot(book));
      t.metrics.push_back(out.metrics);
    }
  }, kFast);
  return traces;
}

}  // namespace

TEST_CASE("invariants 1 and 2 bitwise: after every step (k-means init, EMA, revival) every rank's codebook state is == "
          "1 rank's on the whole batch (W = 2..6; even, uneven, empty, one-rank and random splits; Euclidean and "
          "cosine)") {
  for (bool cosine : {false, true}) {
    CAPTURE(cosine);
    CodebookOptions o = ddp_options(cosine);
    std::vector<Tensor> batches = make_batches(6, 60, o.dim);
    Trace one = run_codebook(o, batches, 1, "even")[0];
    // The scenario fires what invariant 2 covers: k-means init AND revival in
    // step 0, revival again later, and the EMA moves the state in every step
    // with rows (so == is not comparing untouched buffers).
    REQUIRE_FALSE(one.initted_before[0]);
    REQUIRE(one.initted_before[1]);
    CHECK(one.metrics[0].codes_revived() > 0);
    int64_t revived_later = 0;
    for (size_t s = 3; s < batches.size(); ++s) revived_later += one.metrics[s].codes_revived();
    CHECK(revived_later > 0);
    for (size_t s = 1; s < batches.size(); ++s)
      if (batches[s].size(0) > 0) CHECK(first_difference(one.states[s], one.states[s - 1]) != "");
    // Every rank against the 1-rank CPU state: invariant 2, and with it 1;
    // the perplexity from the exact global counts; on sim as on the CPU.
    check_traces_equal(run_codebook(o, batches, 1, "even", Device::sim()), one);
    for (Device device : kTestDevices) {
      CAPTURE(device.str());
      for_each_split(60, 2, 6, [&](int w, const std::string& split) {
        check_traces_equal(run_codebook(o, batches, w, split, device), one);
      });
    }
  }
}

TEST_CASE("invariant 2 bitwise, the statistics: all-reduced float64 code statistics of any split are == the whole "
          "batch's, where float32 sums of the same rows differ (the data make summation order visible)") {
  CodebookOptions o = ddp_options(false);
  std::vector<Tensor> batches = make_batches(6, 60, o.dim);
  int64_t k = o.codebook_size, d = o.dim, float32_differs = 0;
  for (const Tensor& x : batches) {
    int64_t n = x.size(0);
    std::vector<int64_t> idx(n);
    for (int64_t i = 0; i < n; ++i) idx[i] = (i * 7) % k;  // any assignment: the sums are what is checked
    Tensor indices = from_vector(idx, {n});
    Tensor whole = code_stats(x, indices, StatsLayout{k, d, 1}, 0);
    // The same sums in float32, row by row, as a float32 statistic would be.
    auto f32_sums = [&](int64_t begin, int64_t end) {
      std::vector<float> out(k * d, 0.f);
      for (int64_t i = begin; i < end; ++i)
        for (int64_t j = 0; j < d; ++j) out[idx[i] * d + j] += x.data<float>()[i * d + j];
      return out;
    };
    std::vector<float> whole32 = f32_sums(0, n);
    for (int w = 2; w <= 6; ++w)
      for (const std::string& split : kSplitKinds) {
        CAPTURE(w);
        CAPTURE(split);
        std::vector<int64_t> sizes = split_sizes(n, w, split);
        // Each rank's (float64 statistics, float32 sums), all-reduced.
        auto reduced = per_rank(w, [&](Communicator& comm) {
          int64_t begin = std::accumulate(sizes.begin(), sizes.begin() + comm.rank(), int64_t{0});
          Tensor stats = code_stats(shard(x, sizes, comm.rank()), shard(indices, sizes, comm.rank()),
                                    StatsLayout{k, d, comm.world_size()}, comm.rank());
          comm.all_reduce(stats, ReduceOp::sum);
          std::vector<float> part = f32_sums(begin, begin + sizes[comm.rank()]);
          Tensor stats32 = from_vector(part, {k * d});
          comm.all_reduce(stats32, ReduceOp::sum);
          return std::make_pair(stats, stats32);
        });
        // Counts and sums (the flags after them are one per rank, all 0 here).
        for (int r = 0; r < w; ++r)
          CHECK(first_difference({{"stats", reduced[r].first.slice_rows(0, k + k * d)}},
                                 {{"stats", whole.slice_rows(0, k + k * d)}}) == "");
        float32_differs += reduced[0].second.to_vector<float>() != whole32;
      }
  }
  CHECK(float32_differs > 0);
}

namespace {

// Rows whose values span about 2^-24 to 2^24 in magnitude: float64 sums of
// them round, so their order shows in the last bits.
Tensor wide_rows(int64_t n, int64_t d, uint64_t seed) {
  Generator g(seed, 0);
  Tensor x = rand_normal({n, d}, g);
  float* p = x.data<float>();
  for (int64_t i = 0; i < n * d; ++i) p[i] = std::ldexp(p[i], static_cast<int>(g.uniform_int(49)) - 24);
  return x;
}

// wide_rows whose second half negates the first: the true column sums are 0,
// and plain float64 sums of a split of them are not, by an amount that
// depends on the order (the affine transform's mean shows it).
Tensor cancelling_rows(int64_t n, int64_t d, uint64_t seed) {
  Tensor half = wide_rows(n / 2, d, seed);
  return concat({half, neg(half)}, 0);
}

// Sets the order the host backends add the ranks in, and puts the default
// back however the scope is left.
struct OrderScope {
  explicit OrderScope(ReduceOrder o) { set_reduce_order(o); }
  ~OrderScope() { set_reduce_order({}); }
};

const std::vector<std::pair<std::string, ReduceOrder>> kOrders = {
    {"ascending", {}}, {"descending", {true, 0}}, {"rotate:1", {false, 1}}, {"descending rotate:2", {true, 2}}};

}  // namespace

TEST_CASE("invariant 2 bitwise whatever order the ranks are added in (NCCL fixes none): statistics on the agreed grid "
          "of any split and any order are == the whole batch's, where plain float64 sums of the same rows differ") {
  const int64_t k = 8, d = 5, n = 60;
  Tensor x = wide_rows(n, d, 5);
  std::vector<int64_t> idx(n);
  for (int64_t i = 0; i < n; ++i) idx[i] = (i * 5) % k;
  Tensor indices = from_vector(idx, {n});
  const int64_t summed = k + k * d;  // counts and sums; the flags (all 0) follow
  Tensor whole = code_stats(x, indices, StatsLayout{k, d, 1}, 0, grid_scale({x}, nullptr)).slice_rows(0, summed);
  Tensor whole_plain = code_stats(x, indices, StatsLayout{k, d, 1}, 0).slice_rows(0, summed);
  int64_t plain_differs = 0, cases = 0;
  for (const auto& [name, order] : kOrders) {
    CAPTURE(name);
    OrderScope scope(order);
    for_each_split(n, 2, 5, [&](int w, const std::string& split) {
      std::vector<int64_t> sizes = split_sizes(n, w, split);
      auto reduced = per_rank(w, [&](Communicator& comm) {
        Tensor mine = shard(x, sizes, comm.rank());
        StatsLayout layout{k, d, comm.world_size()};
        Tensor exact = code_stats(mine, shard(indices, sizes, comm.rank()), layout, comm.rank(),
                                  grid_scale({mine}, &comm));
        Tensor plain = code_stats(mine, shard(indices, sizes, comm.rank()), layout, comm.rank());
        comm.all_reduce(exact, ReduceOp::sum);
        comm.all_reduce(plain, ReduceOp::sum);
        return std::make_pair(exact.slice_rows(0, summed), plain.slice_rows(0, summed));
      });
      for (int r = 0; r < w; ++r) CHECK(first_difference({{"stats", reduced[r].first}}, {{"stats", whole}}) == "");
      plain_differs += first_difference({{"stats", reduced[0].second}}, {{"stats", whole_plain}}) != "";
      ++cases;
    });
  }
  // The data make order visible: without the grid most cases differ.
  CHECK(plain_differs > cases / 2);
}

TEST_CASE("invariants 1 and 2 bitwise whatever order the ranks are added in: a codebook with k-means init, the "
          "affine transform and revival on wide-ranged, cancelling rows, W = 3 in four orders, == 1 rank") {
  CodebookOptions o = ddp_options(false);
  o.affine_param = true;
  std::vector<Tensor> batches;
  for (int s = 0; s < 4; ++s) batches.push_back(s % 2 ? wide_rows(60, o.dim, 20 + s) : cancelling_rows(60, o.dim, 20 + s));
  Trace one = run_codebook(o, batches, 1, "even")[0];
  for (const auto& [name, order] : kOrders) {
    CAPTURE(name);
    OrderScope scope(order);
    for (std::string split : {"uneven", "random"}) {
      CAPTURE(split);
      check_traces_equal(run_codebook(o, batches, 3, split), one);
    }
  }
}

TEST_CASE("grid_scale: the largest finite |value| of every rank's rows (non-finite values and empty ranks ignored), "
          "the same on the CPU and sim, one max all-reduce") {
  const float inf = std::numeric_limits<float>::infinity();
  for (Device device : kTestDevices) {
    CAPTURE(device.str());
    auto got = per_rank(3, [&](Communicator& comm) {
      std::vector<std::vector<float>> rows = {{0.5f, -inf, 2.f, 1.f}, {}, {-7.25f, std::nanf(""), 3.f, 0.f}};
      const auto& mine = rows[comm.rank()];
      Tensor x = from_vector(mine, {static_cast<int64_t>(mine.size()) / 2, 2}).to(device);
      uint64_t before = comm.counters().collectives;
      Tensor s = grid_scale({x, x}, &comm);
      CHECK(comm.counters().collectives - before == 1);
      return s.to(Device::cpu()).to_vector<double>();
    });
    for (const auto& g : got) CHECK(g == std::vector<double>{7.25});
  }
  Tensor none = from_vector(std::vector<float>{0.f, -0.f}, {1, 2});
  CHECK(grid_scale({none}, nullptr).to_vector<double>() == std::vector<double>{0.0});
}

TEST_CASE("invariant 3: a revived code keeps its sampled vector through the next update; without resetting "
          "embed_avg and cluster_size (the pre-fix order) it loses it") {
  for (bool reset_like_the_fix : {true, false}) {
    CAPTURE(reset_like_the_fix);
    SingleCommunicator comm;
    CodebookOptions o;
    o.codebook_size = 4;
    o.dim = 2;
    o.kmeans_init = false;
    o.decay = 0.5f;
    o.threshold_ema_dead_code = 1.5f;  // not the ones-init, so a reset to the threshold is visible
    Generator init(0, 0);
    Codebook book(o, init);
    Tensor codes = from_vector({0, 0, 10, 10, -10, 10, 10, -10}, {4, 2});
    book.embed.copy_(codes);
    book.embed_avg.copy_(codes);  // cluster_size starts at ones

    // Step 1: every row is near code 0; codes 1..3 decay to 0.5 < 1.5 and are revived.
    Tensor x1 = from_vector({0.1f, 0.2f, -0.1f, 0.3f, 0.2f, -0.2f, -0.3f, 0.1f, 0.4f, 0.4f, -0.2f, -0.4f}, {6, 2});
    CodebookOutput out1 = book.forward(x1, comm);
    REQUIRE(out1.metrics.codes_revived() == 3);
    Tensor sampled = slice_rows(book.embed, 1, 2).clone();  // (1, 2): code 1's new vector, a row of x1
    bool is_row = false;
    for (int64_t r = 0; r < 6; ++r) is_row |= slice_rows(x1, r, r + 1).to_vector<float>() == sampled.to_vector<float>();
    REQUIRE(is_row);
    // embed, embed_avg and cluster_size reset together: avg = row * threshold.
    CHECK(book.cluster_size.to_vector<float>()[1] == 1.5f);
    CHECK(slice_rows(book.embed_avg, 1, 2).to_vector<float>() == mul(sampled, 1.5f).to_vector<float>());
    if (!reset_like_the_fix) {
      // What the buggy order leaves behind: the EMA state of the dead code.
      book.cluster_size.data<float>()[1] = 0.5f;
      book.embed_avg.data<float>()[2] = 0.5f * 10;
      book.embed_avg.data<float>()[3] = 0.5f * 10;
    }
    // Step 2: rows equal to the revived vector, so code 1 is used and not revived again.
    Tensor x2 = concat({sampled, sampled, sampled, sampled}, 0);
    CodebookOutput out2 = book.forward(x2, comm);
    CHECK(out2.indices.to_vector<int64_t>() == std::vector<int64_t>(4, 1));
    auto now = slice_rows(book.embed, 1, 2).to_vector<float>();
    auto want = sampled.to_vector<float>();
    double err = std::abs(now[0] - want[0]) + std::abs(now[1] - want[1]);
    if (reset_like_the_fix)
      CHECK(err < 1e-4);  // only Laplace smoothing moves it
    else
      CHECK(err > 1.0);  // pulled back toward the stale statistics
  }
}

TEST_CASE("revival on the device gives the j-th expired code the sampler's j-th row of the same stream: N < m, "
          "m <= N < K and N >= K, on 1 rank and on 3 uneven ranks with an empty one, on the CPU and on sim") {
  const int64_t k = 16, m = 12, d = 3;  // codes 0..11 expired, 12..15 alive
  for (Device device : kTestDevices)
    for (int64_t n : {10, 14, 40})  // with replacement; without, fewer rows than codes; without
      for (int w : {1, 3}) {
        CAPTURE(device.str());
        CAPTURE(n);
        CAPTURE(w);
        CodebookOptions o;
        o.codebook_size = k;
        o.dim = d;
        o.kmeans_init = false;
        o.decay = 1.f;  // cluster sizes stay as set: exactly codes 0..11 expire
        o.threshold_ema_dead_code = 1.f;
        o.seed = 9;
        Generator data(5, 0);
        Tensor x = rand_normal({n, d}, data);
        std::vector<int64_t> sizes = w == 1 ? std::vector<int64_t>{n} : std::vector<int64_t>{0, n / 3, n - n / 3};
        run_ranks(w, [&](Communicator& comm) {
          Generator init(1, 0);
          Codebook book(o, init);
          std::vector<float> cs(k, 0.f);
          for (int64_t c = m; c < k; ++c) cs[c] = 5.f;
          book.cluster_size.copy_(from_vector(cs, {k}));
          book.to(device);
          Tensor mine = shard(x, sizes, comm.rank());
          CodebookOutput out = book.forward(mine.to(device), comm);
          CHECK(out.metrics.codes_revived() == m);
          // The sampler's rows from the stream the revival used (the first: no
          // k-means draw came before it).
          Generator shared(o.seed, streams::kCodebookDraws);
          Tensor want = sample_rows(mine, m, comm, shared);
          Tensor embed = book.embed.to(Device::cpu());
          CHECK(first_difference({{"revived rows", embed.slice_rows(0, m)}}, {{"revived rows", want}}) == "");
        }, kFast);
      }
}

TEST_CASE("invariant 4: eval issues no collective and changes no state; an uninitialised codebook in eval is an error "
          "that issues none either") {
  run_ranks(2, [&](Communicator& comm) {
    Generator init(0, 0);
    Codebook book(ddp_options(false), init);
    book.eval();
    CHECK_THROWS_WITH_AS(book.forward(ones({3, 6}), comm), doctest::Contains("codebook is not initialised"), Error);
    CHECK(comm.counters().collectives == 0);
    book.train();
    Generator data(5, comm.rank());
    book.forward(rand_normal({20, 6}, data), comm);
    uint64_t after_training = comm.counters().collectives;
    CHECK(after_training > 0);
    NamedTensors before = snapshot(book);
    book.eval();
    CodebookOutput out = book.forward(rand_normal({20, 6}, data), comm);
    CHECK(out.indices.numel() == 20);
    CHECK(comm.counters().collectives == after_training);
    CHECK(bitwise_equal(snapshot(book), before));
    // Training mode under no-grad is inference too: a validation pass that
    // only rank 0 runs must not wait for the other rank.
    book.train();
    if (comm.rank() == 0) {
      NoGradGuard no_grad;
      book.forward(rand_normal({20, 6}, data), comm);
    }
    CHECK(comm.counters().collectives == after_training);
    CHECK(bitwise_equal(snapshot(book), before));
  }, kFast);
}

TEST_CASE("invariant 6: when no rank has rows, every rank skips k-means alike and stays uninitialised") {
  run_ranks(3, [&](Communicator& comm) {
    Generator init(0, 0);
    Codebook book(ddp_options(false), init);
    CodebookOutput out = book.forward(zeros({0, 6}), comm);
    CHECK_FALSE(book.initted());
    CHECK(out.indices.numel() == 0);
    // Next step with rows on one rank only: all ranks initialise together.
    Generator data(1, 0);
    Tensor x = comm.rank() == 1 ? rand_normal({30, 6}, data) : zeros({0, 6});
    book.forward(x, comm);
    CHECK(book.initted());
  }, kFast);
}

TEST_CASE("invariant 8: the communicator comes with each call, never from construction") {
  Generator init(0, 0);
  Codebook book(ddp_options(false), init);
  SingleCommunicator a, b;
  Generator data(2, 0);
  book.forward(rand_normal({20, 6}, data), a);
  uint64_t used_a = a.counters().collectives;
  CHECK(used_a > 0);
  book.forward(rand_normal({20, 6}, data), b);
  CHECK(a.counters().collectives == used_a);
  CHECK(b.counters().collectives > 0);
}

TEST_CASE("invariant 8: a codebook stepped alone, then in a 2-rank group, reduces with the group it is given") {
  // A module that cached 'world of one' (or any communicator) from its
  // first call would not all-reduce later: its two ranks would diverge.
  CodebookOptions o = ddp_options(false);
  Generator data(5, 0);
  Tensor first = rand_normal({20, 6}, data);
  std::vector<Tensor> later = {rand_normal({24, 6}, data), rand_normal({24, 6}, data)};
  auto stepped_alone = [&] {
    Generator init(0, 0);
    auto book = std::make_unique<Codebook>(o, init);
    SingleCommunicator solo;
    book->forward(first, solo);
    return book;
  };
  auto reference = stepped_alone();
  SingleCommunicator solo;
  for (const Tensor& x : later) reference->forward(x, solo);
  std::vector<std::unique_ptr<Codebook>> books;
  books.push_back(stepped_alone());
  books.push_back(stepped_alone());
  run_ranks(2, [&](Communicator& comm) {
    for (const Tensor& x : later)
      books[comm.rank()]->forward(shard(x, split_sizes(24, 2, "uneven"), comm.rank()), comm);
  }, kFast);
  CHECK(first_difference(snapshot(*books[0]), snapshot(*books[1])) == "");
  CHECK(first_difference(snapshot(*books[0]), snapshot(*reference)) == "");  // invariant 2: bitwise
}

TEST_CASE("k-means init sets embed = means, embed_avg = means * counts (not means) and cluster_size = counts") {
  SingleCommunicator comm;
  CodebookOptions o = ddp_options(false);
  o.threshold_ema_dead_code = 0;
  o.decay = 1.f;  // no EMA movement: after step 1, embed_avg and cluster_size are the init itself
  Generator init(0, 0), data(3, 0);
  Codebook book(o, init);
  Tensor x = rand_normal({50, 6}, data);
  book.forward(x, comm);
  // The same k-means, from the codebook's first shared draw stream.
  Generator draw0(o.seed, streams::kCodebookDraws + 0);
  KmeansResult km = kmeans(x, o.codebook_size, o.kmeans_iters, false, comm, draw0);
  CHECK(book.cluster_size.to_vector<float>() == km.bins.to_vector<float>());
  CHECK(book.embed_avg.to_vector<float>() == mul(km.means, reshape(km.bins, {-1, 1})).to_vector<float>());
  CHECK(sum(km.bins).item<float>() == 50.f);
  int64_t multi = 0;  // the formula is only distinguishable where a code has more than one row
  for (float b : km.bins.to_vector<float>()) multi += b > 1;
  CHECK(multi > 0);
}

TEST_CASE("zeros-initialised cluster sizes and an empty first step give no NaN") {
  SingleCommunicator comm;
  CodebookOptions o = ddp_options(false);
  o.kmeans_init = false;
  o.cluster_size_init_ones = false;
  Generator init(0, 0);
  Codebook book(o, init);
  NamedTensors before = snapshot(book);
  book.forward(zeros({0, 6}), comm);
  for (float v : book.embed.to_vector<float>()) CHECK(std::isfinite(v));
  CHECK(book.embed.to_vector<float>() == before.front().second.to_vector<float>());  // embed: the first buffer, no parameters
}

TEST_CASE("a cosine learnable codebook is used normalised, whatever the optimizer did to its norms") {
  SingleCommunicator comm;
  CodebookOptions o;
  o.codebook_size = 2;
  o.dim = 2;
  o.cosine = true;
  o.learnable = true;
  o.kmeans_init = false;
  Generator init(0, 0);
  Codebook book(o, init);
  book.embed.copy_(from_vector({10, 1, 0.1f, 0.1f}, {2, 2}));  // long row 0, short row 1 at 45 degrees
  book.eval();
  CodebookOutput out = book.forward(from_vector({1, 1}, {1, 2}), comm);
  CHECK(out.indices.item<int64_t>() == 1);  // by raw dot product row 0 would win
  auto q = out.quantize.to_vector<float>();
  CHECK(q[0] * q[0] + q[1] * q[1] == doctest::Approx(1.f));
}

TEST_CASE("bad input: more rows than the exact sums hold (2^26 per step over all ranks) is refused naming the rank "
          "and its rows") {
  // A world of 2^20 leaves each rank 64 rows: 65 are too many, 64 fit.
  const StatsLayout layout{4, 2, 1 << 20};
  Tensor x = zeros({65, 2});
  Tensor idx = zeros({65}, DType::i64);
  Tensor grid = grid_scale({x}, nullptr);
  CHECK_THROWS_WITH_AS(code_stats(x, idx, layout, 3, grid),
                       doctest::Contains("at most 2^26 rows per step over all ranks (exact sums); rank 3 has 65 rows"),
                       Error);
  CHECK_NOTHROW(code_stats(x.slice_rows(0, 64), idx.slice_rows(0, 64), layout, 3, grid));
}

TEST_CASE("bad input: wrong trailing dimension, and non-finite rows refused before any state changes") {
  SingleCommunicator comm;
  Generator init(0, 0), data(4, 0);
  Codebook book(ddp_options(false), init);
  CHECK_THROWS_WITH_AS(book.forward(ones({4, 5}), comm), doctest::Contains("rank 0: codebook expects float32 rows [N, 6]"),
                       Error);
  book.forward(rand_normal({20, 6}, data), comm);
  NamedTensors before = snapshot(book);
  Tensor bad = rand_normal({10, 6}, data);
  bad.data<float>()[3 * 6 + 2] = std::nanf("");
  CHECK_THROWS_WITH_AS(book.forward(bad, comm), doctest::Contains("rank 0: row 3 of the codebook's input has a non-finite "
                                                                   "value (in column 2)"),
                       NonFiniteError);
  CHECK(bitwise_equal(snapshot(book), before));
  // In a group, the failing rank is named and the others do not hang.
  CHECK_THROWS_WITH_AS(run_ranks(2, [&](Communicator& c) {
                         Generator i2(0, 0), d2(4, c.rank());
                         Codebook b2(ddp_options(false), i2);
                         Tensor x = rand_normal({8, 6}, d2);
                         if (c.rank() == 1) x.data<float>()[5 * 6] = INFINITY;
                         b2.forward(x, c);
                       }, kFast),
                       doctest::Contains("rank 1: row 5"), Error);
}

TEST_CASE("unsynchronised statistics still share the non-finite flags: a bad row on one rank stops every rank, "
          "naming that rank, on the CPU and on sim") {
  for (Device device : kTestDevices) {
    CAPTURE(device.str());
    CodebookOptions o = ddp_options(false);
    o.kmeans_init = false;
    o.sync_stats = false;
    std::vector<std::string> errors = per_rank(3, [&](Communicator& comm) -> std::string {
      Generator init(1, 0), data(2, 0);
      Codebook book(o, init);
      book.to(device);
      Tensor x = rand_normal({5, o.dim}, data);
      if (comm.rank() == 1) x.data<float>()[2 * o.dim + 1] = std::nanf("");
      try {
        CodebookOutput out = book.forward(x.to(device), comm);
        out.metrics.check();  // on sim the error comes when the metrics are read
      } catch (const NonFiniteError& e) {
        return e.what();
      }
      return "";
    });
    for (const std::string& e : errors)
      CHECK(e.find("rank 1: row 2 of the codebook's input has a non-finite value (in column 1)") != std::string::npos);
  }
}

TEST_CASE("cluster_size starts at ones by default and at zeros by option") {
  Generator init(0, 0);
  CodebookOptions o = ddp_options(false);
  CHECK(Codebook(o, init).cluster_size.to_vector<float>() == std::vector<float>(16, 1.f));
  o.cluster_size_init_ones = false;
  CHECK(Codebook(o, init).cluster_size.to_vector<float>() == std::vector<float>(16, 0.f));
}

TEST_CASE("golden: six EMA steps match the numpy reference (tests/vq/golden), W = 1 and W = 3 uneven") {
  const char* src = std::getenv("VQDDP_SOURCE_DIR");
  std::string dir = std::string(src ? src : ".") + "/tests/vq/golden/";
  for (const std::string name : {"ema_euclidean.safetensors", "ema_cosine.safetensors"}) {
    CAPTURE(name);
    SafetensorsFile f = safetensors_load(dir + name);
    CodebookOptions o;
    o.codebook_size = std::stoll(f.metadata.at("K"));
    o.dim = std::stoll(f.metadata.at("D"));
    o.decay = std::stof(f.metadata.at("decay"));
    o.eps = std::stof(f.metadata.at("eps"));
    o.cosine = f.metadata.at("cosine") == "true";
    o.kmeans_init = false;
    o.threshold_ema_dead_code = 0;
    float weight = std::stof(f.metadata.at("commitment_weight"));
    int steps = std::stoi(f.metadata.at("steps"));
    for (int w : {1, 3}) {
      CAPTURE(w);
      run_ranks(w, [&](Communicator& comm) {
        Generator init(0, 0);
        Codebook book(o, init);
        Tensor e0 = o.cosine ? l2_normalize_rows(f.at("embed0")) : f.at("embed0");
        book.embed.copy_(e0);
        book.embed_avg.copy_(e0);
        for (int s = 0; s < steps; ++s) {
          CAPTURE(s);
          const Tensor& x = f.at("x." + std::to_string(s));
          std::vector<int64_t> sizes = split_sizes(x.size(0), w, "uneven");
          Tensor mine = shard(x, sizes, comm.rank());
          CodebookOutput out = book.forward(mine, comm);
          check_close({{"embed", book.embed}, {"embed_avg", book.embed_avg}, {"cluster_size", book.cluster_size}},
                      {{"embed", f.at("embed." + std::to_string(s))},
                       {"embed_avg", f.at("embed_avg." + std::to_string(s))},
                       {"cluster_size", f.at("cluster_size." + std::to_string(s))}},
                      1e-5, 1e-6);
          CHECK(out.indices.to_vector<int64_t>() ==
                shard(f.at("indices." + std::to_string(s)), sizes, comm.rank()).to_vector<int64_t>());
          CHECK(out.metrics.perplexity() == doctest::Approx(f.at("perplexity." + std::to_string(s)).item<float>()).epsilon(1e-5));
          if (w == 1) {
            float loss = commitment_loss(out.quantize, x, weight, comm).item<float>();
            CHECK(loss == doctest::Approx(f.at("loss." + std::to_string(s)).item<float>()).epsilon(1e-5));
          }
        }
      }, kFast);
    }
  }
}
