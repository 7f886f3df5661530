// Helpers for the multi-rank VQ tests: shard a global batch, run every
// split, collect each rank's result, snapshot and compare module state
// bitwise or within a tolerance.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "comm/thread_group.h"
#include "engine/nn.h"
#include "engine/ops.h"
#include "engine/core/random.h"
#include "vq/codebook.h"

namespace vqddp::test {

inline constexpr ThreadGroupOptions kFast{.timeout = std::chrono::milliseconds(3000)};

// Row counts of W shards of N rows: "even" (as even as possible),
// "uneven" (rank r gets weight r+1), "empty" (rank 0 and the last rank
// get nothing when W > 2, else rank 0 does), "one" (rank 0 gets every
// row), "random" (W - 1 cut points drawn from a generator keyed by
// n and W: any split, empty ranks included).
inline std::vector<int64_t> split_sizes(int64_t n, int w, const std::string& kind) {
  std::vector<int64_t> s(w, 0);
  if (kind == "one") {
    s[0] = n;
    return s;
  }
  if (kind == "random") {
    Generator g(static_cast<uint64_t>(n), static_cast<uint64_t>(w));
    std::vector<int64_t> cuts{0, n};
    for (int r = 1; r < w; ++r) cuts.push_back(static_cast<int64_t>(g.uniform_int(static_cast<uint64_t>(n + 1))));
    std::sort(cuts.begin(), cuts.end());
    for (int r = 0; r < w; ++r) s[r] = cuts[r + 1] - cuts[r];
    return s;
  }
  std::vector<int64_t> weight(w, 1);
  if (kind == "uneven")
    for (int r = 0; r < w; ++r) weight[r] = r + 1;
  if (kind == "empty" && w > 1) {
    weight[0] = 0;
    if (w > 2) weight[w - 1] = 0;
  }
  int64_t total_w = std::accumulate(weight.begin(), weight.end(), int64_t{0}), given = 0;
  for (int r = 0; r < w; ++r) {
    s[r] = n * weight[r] / total_w;
    given += s[r];
  }
  for (int r = w - 1; given < n; r = (r + w - 1) % w)
    if (weight[r] > 0) {
      ++s[r];
      ++given;
    }
  return s;
}

// The split kinds every invariant-2 test runs, and a check that they really
// split N rows over W ranks differently: the sizes add up to N, each kind
// is what its name says, and for W > 1 no two kinds give the same split
// (so a test that passes on all of them has seen the rows regrouped).
inline const std::vector<std::string> kSplitKinds = {"even", "uneven", "empty", "one", "random"};

inline void check_splits_differ(int64_t n, int w) {
  CAPTURE(n);
  CAPTURE(w);
  std::set<std::vector<int64_t>> seen;
  for (const std::string& kind : kSplitKinds) {
    CAPTURE(kind);
    std::vector<int64_t> s = split_sizes(n, w, kind);
    REQUIRE(static_cast<int>(s.size()) == w);
    REQUIRE(std::accumulate(s.begin(), s.end(), int64_t{0}) == n);
    int64_t empty = std::count(s.begin(), s.end(), int64_t{0});
    if (kind == "one") CHECK(empty == w - 1);
    if (kind == "empty" && w > 1) CHECK(empty >= 1);
    if (kind == "uneven" && w > 1) CHECK(s.front() < s.back());
    if (kind == "even" && n >= w) CHECK(empty == 0);
    seen.insert(s);
  }
  if (w > 1 && n >= 2 * w) CHECK(seen.size() == kSplitKinds.size());
}

// Calls f(w, split) for every W in [w_from, w_to] and every split kind of
// N rows, after check_splits_differ(n, w); a failure names W and the split.
// Start at W = 2 where the test's reference is 1 rank: for W = 1 every kind
// is the same split, which would only re-prove determinism.
template <class F>
void for_each_split(int64_t n, int w_from, int w_to, F f) {
  for (int w = w_from; w <= w_to; ++w) {
    check_splits_differ(n, w);
    for (const std::string& split : kSplitKinds) {
      CAPTURE(w);
      CAPTURE(split);
      f(w, split);
    }
  }
}

// Runs f(comm) on W rank threads; returns each rank's result, by rank.
template <class F>
auto per_rank(int w, F f) {
  std::vector<std::invoke_result_t<F&, Communicator&>> got(w);
  run_ranks(w, [&](Communicator& comm) { got[comm.rank()] = f(comm); }, kFast);
  return got;
}

// The tensor called `name` (a parameter or a buffer of a module).
inline Tensor named(const NamedTensors& tensors, const std::string& name) {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  FAIL("no tensor named " << name);
  return Tensor();
}

inline Tensor shard(const Tensor& x, const std::vector<int64_t>& sizes, int rank) {
  int64_t begin = std::accumulate(sizes.begin(), sizes.begin() + rank, int64_t{0});
  return x.slice_rows(begin, begin + sizes[rank]);
}

// The assignment score of row i of x (N, D) for code j of e (K, D), in
// double: the squared distance, or minus the dot product for cosine
// codebooks (rows already normalised). Lower is better.
inline double code_score(const Tensor& x, int64_t i, const Tensor& e, int64_t j, bool cosine) {
  int64_t d = x.size(1);
  const float *px = x.data<float>() + i * d, *pe = e.data<float>() + j * d;
  double s = 0;
  for (int64_t c = 0; c < d; ++c) s += cosine ? -double(px[c]) * pe[c] : (double(px[c]) - pe[c]) * (double(px[c]) - pe[c]);
  return s;
}

// Clones of every parameter and buffer, by name.
// Host copies, so states on any device (sim, cuda) compare.
inline NamedTensors snapshot(const Module& m) { return m.state_copy(Device::cpu()); }

// The devices every invariant test runs on: the CPU, and the simulated
// device, whose results must be the CPU's bit for bit (it computes with the
// CPU's kernels, through every device path: flags read late, revival on
// the device, staging in the thread backend).
inline const std::vector<Device> kTestDevices = {Device::cpu(), Device::sim()};

// "" when a and b are bitwise equal, else where they first differ: the
// tensor's name and, for equal shapes, the element and both values (as
// numbers and as bits), so a failing CHECK(first_difference(a, b) == "")
// says what broke.
inline std::string first_difference(const NamedTensors& a, const NamedTensors& b) {
  if (a.size() != b.size()) return "different tensor counts " + std::to_string(a.size()) + " and " + std::to_string(b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const Tensor &x = a[i].second, &y = b[i].second;
    const std::string& name = a[i].first;
    if (name != b[i].first) return "tensor " + std::to_string(i) + " is '" + name + "' and '" + b[i].first + "'";
    if (x.shape() != y.shape() || x.dtype() != y.dtype()) return "'" + name + "': " + x.desc() + " and " + y.desc();
    size_t width = dtype_size(x.dtype());
    const auto *px = static_cast<const unsigned char*>(x.raw_data()), *py = static_cast<const unsigned char*>(y.raw_data());
    for (int64_t j = 0; j < x.numel(); ++j) {
      if (std::memcmp(px + j * width, py + j * width, width) == 0) continue;
      std::string at = "'" + name + "'[" + std::to_string(j) + "]: ";
      if (x.dtype() == DType::f32) {
        float u = x.data<float>()[j], v = y.data<float>()[j];
        uint32_t bu, bv;
        std::memcpy(&bu, &u, 4);
        std::memcpy(&bv, &v, 4);
        char buf[160];
        std::snprintf(buf, sizeof buf, "%.9g (0x%08x) vs %.9g (0x%08x)", u, bu, v, bv);
        return at + buf;
      }
      if (x.dtype() == DType::i64) return at + std::to_string(x.data<int64_t>()[j]) + " vs " + std::to_string(y.data<int64_t>()[j]);
      return at + "bytes differ";
    }
  }
  return "";
}

inline bool bitwise_equal(const NamedTensors& a, const NamedTensors& b) { return first_difference(a, b).empty(); }

// A step's metrics as a list: one per codebook updated (a Codebook's single
// CodebookMetrics, or a VectorQuantize/ResidualVQ output's vector).
inline std::vector<CodebookMetrics> metrics_list(const CodebookMetrics& m) { return {m}; }
inline const std::vector<CodebookMetrics>& metrics_list(const std::vector<CodebookMetrics>& m) { return m; }

// Invariants 1 and 2 over a run: `ranks` are W ranks' traces and `one` the
// trace of 1 rank on the whole batch, each with .states (module state after
// each step) and .metrics (that step's metrics). After every step every
// rank's state is bitwise the 1-rank state, and every rank's metrics (from
// the exact global counts) equal the 1-rank metrics field by field.
template <class Trace>
void check_traces_equal(const std::vector<Trace>& ranks, const Trace& one) {
  REQUIRE(one.metrics.size() == one.states.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    REQUIRE(ranks[r].states.size() == one.states.size());
    REQUIRE(ranks[r].metrics.size() == one.metrics.size());
  }
  for (size_t s = 0; s < one.states.size(); ++s) {
    CAPTURE(s);
    for (size_t r = 0; r < ranks.size(); ++r) {
      CAPTURE(r);
      CHECK(first_difference(ranks[r].states[s], one.states[s]) == "");
      const std::vector<CodebookMetrics>& want = metrics_list(one.metrics[s]);
      const std::vector<CodebookMetrics>& got = metrics_list(ranks[r].metrics[s]);
      REQUIRE(got.size() == want.size());
      for (size_t b = 0; b < want.size(); ++b) {
        CAPTURE(b);
        CHECK(got[b].codes_revived() == want[b].codes_revived());
        CHECK(got[b].codes_used() == want[b].codes_used());
        CHECK(got[b].rows() == want[b].rows());
        CHECK(got[b].perplexity() == want[b].perplexity());
      }
    }
  }
}

// Checks |a - b| <= atol + rtol * |b| element-wise for every float tensor
// (a NaN on either side fails), exact equality for int64 tensors.
inline void check_close(const NamedTensors& a, const NamedTensors& b, double rtol, double atol) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CAPTURE(a[i].first);
    const Tensor &x = a[i].second, &y = b[i].second;
    REQUIRE(x.shape() == y.shape());
    if (x.dtype() == DType::i64) {
      CHECK(x.to_vector<int64_t>() == y.to_vector<int64_t>());
      continue;
    }
    const float *px = x.data<float>(), *py = y.data<float>();
    int64_t bad = 0, first_bad = -1;
    for (int64_t j = 0; j < x.numel(); ++j)
      // Written as !(diff <= bound) so a NaN counts as a failure, which
      // std::max over the differences silently dropped.
      if (!(std::abs(double(px[j]) - py[j]) <= atol + rtol * std::abs(double(py[j])))) {
        if (bad++ == 0) first_bad = j;
      }
    CAPTURE(first_bad);
    CHECK(bad == 0);
  }
}

// 100 codes of dimension 2: (9, 9) except three identical nearest codes
// (1, 0) at 35, 50 and 97. The argmin orders by (score, then code index), so
// an exact tie goes to the lowest index: rows near (1, 0) get 35 on every
// backend, whatever order the codes are scanned or merged in.
inline Tensor tied_codebook() {
  std::vector<float> e(200, 9.f);
  for (int j : {35, 50, 97}) {
    e[2 * j] = 1.f;
    e[2 * j + 1] = 0.f;
  }
  return from_vector(e, {100, 2});
}

}  // namespace vqddp::test
