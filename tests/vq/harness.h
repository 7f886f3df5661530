// Helpers for the multi-rank VQ tests: shard a global batch, snapshot and
// compare module state bitwise or within a tolerance.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "comm/thread_group.h"
#include "engine/nn.h"
#include "engine/ops.h"

namespace vqddp::test {

inline constexpr ThreadGroupOptions kFast{.timeout = std::chrono::milliseconds(3000)};

// Row counts of W shards of N rows: "even" (as even as possible),
// "uneven" (rank r gets weight r+1), "empty" (rank 0 and the last rank
// get nothing when W > 2, else rank 0 does).
inline std::vector<int64_t> split_sizes(int64_t n, int w, const std::string& kind) {
  std::vector<int64_t> s(w, 0);
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
inline NamedTensors snapshot(const Module& m) { return m.state_copy(); }

inline bool bitwise_equal(const NamedTensors& a, const NamedTensors& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const Tensor &x = a[i].second, &y = b[i].second;
    if (a[i].first != b[i].first || x.shape() != y.shape() || x.dtype() != y.dtype()) return false;
    if (std::memcmp(x.raw_data(), y.raw_data(), x.numel() * dtype_size(x.dtype())) != 0) return false;
  }
  return true;
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
// (1, 0) at 35, 50 and 97, placed so every lane-merge shortcut picks wrong
// (see test_assign.cpp); the right answer for rows near (1, 0) is 35.
inline Tensor tied_codebook() {
  std::vector<float> e(200, 9.f);
  for (int j : {35, 50, 97}) {
    e[2 * j] = 1.f;
    e[2 * j + 1] = 0.f;
  }
  return from_vector(e, {100, 2});
}

}  // namespace vqddp::test
