// The distributed sampler and k-means: identical on every rank, and
// independent of how the global batch is split (1 rank == W ranks).
#include <doctest/doctest.h>

#include <algorithm>
#include <set>

#include "tests/vq/harness.h"
#include "vq/assign.h"
#include "vq/kmeans.h"
#include "vq/kernels/vq_kernels.h"
#include "vq/sampler.h"

using namespace vqddp;
using namespace vqddp::test;

TEST_CASE("draw_row_numbers: without replacement when there are enough rows, with replacement otherwise") {
  Generator g(3, 1);
  auto d = draw_row_numbers(1000000, 500, g);
  CHECK(std::set<int64_t>(d.begin(), d.end()).size() == 500);
  for (int64_t v : d) CHECK((v >= 0 && v < 1000000));
  Generator h(3, 1);
  CHECK(draw_row_numbers(1000000, 500, h) == d);  // shared stream: same list
  auto all = draw_row_numbers(10, 10, g);
  std::sort(all.begin(), all.end());
  for (int i = 0; i < 10; ++i) CHECK(all[i] == i);  // m == n: a permutation
  auto few = draw_row_numbers(3, 8, g);
  CHECK(few.size() == 8);
  for (int64_t v : few) CHECK((v >= 0 && v < 3));
  CHECK(draw_row_numbers(0, 5, g).empty());
}

TEST_CASE("sample_rows: the same block on every rank and for every split kind, W = 2..4, as 1 rank's") {
  Generator data(9, 0);
  Tensor x = rand_normal({41, 5}, data);  // (41, 5) global batch
  for (int64_t m : {int64_t{7}, int64_t{41}, int64_t{60}}) {
    CAPTURE(m);
    Tensor reference = per_rank(1, [&](Communicator& comm) {
      Generator g(5, 2);
      return sample_rows(x, m, comm, g);
    })[0];
    REQUIRE(reference.shape() == Shape{m, 5});
    for_each_split(41, 2, 4, [&](int w, const std::string& split) {  // empty ranks included
      std::vector<Tensor> got = per_rank(w, [&](Communicator& comm) {
        Generator g(5, 2);
        return sample_rows(shard(x, split_sizes(41, w, split), comm.rank()), m, comm, g);
      });
      for (int r = 0; r < w; ++r) CHECK(got[r].to_vector<float>() == reference.to_vector<float>());
    });
  }
}

TEST_CASE("sample_rows returns the drawn rows in draw order: x[draw_row_numbers(...)] on any split") {
  // Pins the order, which the split-invariance test cannot: a wrong
  // un-permutation would be wrong alike for every W.
  Generator data(9, 1);
  Tensor x = rand_normal({13, 3}, data);
  for (int64_t m : {int64_t{5}, int64_t{13}, int64_t{20}}) {  // fewer, as many, more rows than the batch
    Generator g0(4, 7);
    Tensor want = index_select(x, from_vector(draw_row_numbers(13, m, g0), {m}));
    for (int w : {1, 3})
      for (const std::string kind : {"uneven", "empty"}) {
        CAPTURE(m);
        CAPTURE(w);
        CAPTURE(kind);
        std::vector<Tensor> got = per_rank(w, [&](Communicator& comm) {
          Generator g(4, 7);
          return sample_rows(shard(x, split_sizes(13, w, kind), comm.rank()), m, comm, g);
        });
        for (int r = 0; r < w; ++r) CHECK(got[r].to_vector<float>() == want.to_vector<float>());
      }
  }
}

TEST_CASE("sample_rows: every drawn row is a row of the global batch") {
  Tensor x = reshape(arange(20, DType::f32), {10, 2});  // row i = (2i, 2i+1)
  run_ranks(3, [&](Communicator& comm) {
    Generator g(1, 1);
    Tensor s = sample_rows(shard(x, split_sizes(10, 3, "uneven"), comm.rank()), 6, comm, g);
    auto v = s.to_vector<float>();
    std::set<float> firsts;
    for (int i = 0; i < 6; ++i) {
      CHECK(v[2 * i + 1] == v[2 * i] + 1);
      CHECK(int(v[2 * i]) % 2 == 0);
      firsts.insert(v[2 * i]);
    }
    CHECK(firsts.size() == 6);  // without replacement
  }, kFast);
}

TEST_CASE("sample_rows: when no rank has rows every rank returns an empty block alike") {
  run_ranks(3, [&](Communicator& comm) {
    Generator g(1, 1);
    Tensor s = sample_rows(zeros({0, 4}), 5, comm, g);
    CHECK(s.shape() == Shape{0, 4});
    CHECK(comm.counters().collectives == 1);  // only the count gather
  }, kFast);
}

TEST_CASE("k-means bitwise: identical on all ranks and == one rank on the whole batch (W = 2..6, every split kind)") {
  Generator data(2, 0);
  // Three blobs so the clustering is well defined.
  Tensor centers = from_vector({0, 0, 5, 5, -5, 5}, {3, 2});
  std::vector<int64_t> which(90);
  for (int i = 0; i < 90; ++i) which[i] = i % 3;
  Tensor x = add(index_select(centers, from_vector(which, {90})), mul(rand_normal({90, 2}, data), 0.5f));
  for (bool cosine : {false, true}) {
    CAPTURE(cosine);
    Tensor input = cosine ? l2_normalize_rows(x) : x;
    KmeansResult one = per_rank(1, [&](Communicator& comm) {
      Generator g(4, 0);
      return kmeans(input, 3, 10, cosine, comm, g);
    })[0];
    for_each_split(90, 2, 6, [&](int w, const std::string& split) {
      std::vector<KmeansResult> got = per_rank(w, [&](Communicator& comm) {
        Generator g(4, 0);
        return kmeans(shard(input, split_sizes(90, w, split), comm.rank()), 3, 10, cosine, comm, g);
      });
      // The statistics are exact sums on their agreed grid, and the
      // assignment is batch-invariant: the same bits.
      for (int r = 0; r < w; ++r)
        CHECK(first_difference({{"means", got[r].means}, {"bins", got[r].bins}},
                               {{"means", one.means}, {"bins", one.bins}}) == "");
    });
    CHECK(sum(one.bins).item<float>() == 90.f);
  }
}

TEST_CASE("k-means keeps the mean of an empty cluster") {
  for (Device device : {Device::cpu(), Device::sim()}) {
    CAPTURE(device.str());
    Tensor means = from_vector({1, 1, 7, 7}, {2, 2}).to(device), bins = empty({2}, DType::f32, device);
    // counts (2, 0), sums ((4, 6), (0, 0)), one rank's flag
    Tensor stats = from_vector(std::vector<double>{2, 0, 4, 6, 0, 0, 0}, {7}).to(device);
    vq_kernels(device).kmeans_update(stats, StatsLayout{2, 2, 1}, means, bins);
    CHECK(means.to_vector<float>() == std::vector<float>{2, 3, 7, 7});
    CHECK(bins.to_vector<float>() == std::vector<float>{2, 0});
  }
}
