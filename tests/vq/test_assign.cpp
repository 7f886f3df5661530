// The blocked distance + argmin against a brute-force reference.
#include <doctest/doctest.h>

#include "engine/ops.h"
#include "engine/core/random.h"
#include "tests/vq/harness.h"
#include "vq/assign.h"

using namespace vqddp;
using namespace vqddp::test;

namespace {
// Full N x K distance matrix, then argmin: the obviously-correct version.
Tensor brute_force(const Tensor& x, const Tensor& e, bool cosine) {
  int64_t n = x.size(0), k = e.size(0);
  std::vector<int64_t> out(n);
  for (int64_t i = 0; i < n; ++i) {
    double best = 0;
    for (int64_t j = 0; j < k; ++j) {
      double s = code_score(x, i, e, j, cosine);
      if (j == 0 || s < best) {
        best = s;
        out[i] = j;
      }
    }
  }
  return from_vector(out, {n});
}
}  // namespace

// 3 * 256 + 17 rows: three full 256-row tasks of the CPU's fixed_gemm_argmin
// (engine/cpu/fixed_gemm.cpp) and a partial one.
TEST_CASE("assign_codes equals the brute-force argmin over several row tasks and a partial one") {
  Generator g(1, 0);
  for (bool cosine : {false, true}) {
    Tensor x = rand_normal({3 * 256 + 17, 12}, g);
    Tensor e = rand_normal({37, 12}, g);
    if (cosine) {
      x = l2_normalize_rows(x);
      e = l2_normalize_rows(e);
    }
    CHECK(assign_codes(x, e, cosine).to_vector<int64_t>() == brute_force(x, e, cosine).to_vector<int64_t>());
  }
}

TEST_CASE("assign_codes breaks ties to the lowest code index") {
  // Codes 1 and 3 are identical and nearest to every row; code 0 is far.
  Tensor e = from_vector({9, 9, 1, 0, 5, 5, 1, 0}, {4, 2});
  Tensor x = from_vector({1, 0, 1.1f, 0.1f, 0.9f, -0.1f}, {3, 2});
  CHECK(assign_codes(x, e, false).to_vector<int64_t>() == std::vector<int64_t>{1, 1, 1});
  // Cosine ties: codes 2 and 3 are the same direction, (1, 0) matches both.
  Tensor u = from_vector({0, 1, -1, 0, 1, 0, 1, 0}, {4, 2});
  CHECK(assign_codes(from_vector({1, 0}, {1, 2}), u, true).to_vector<int64_t>() == std::vector<int64_t>{2});
}

// K = 100 codes, all far except three identical nearest ones at 35, 50 and
// 97, so the partial minima every kernel keeps hold equal scores that its
// merge must settle by code (kernel_math.h, nearest_better). In the CPU's
// panels of 32 or 16 codes they sit in lanes 3, 18 (or 2) and 1, 97 in the
// partial last panel; on the GPU's 128-code tile one thread holds 35 and
// 97, another 50. A merge that preferred the lower lane would pick 97.
// Shared with the GPU suite (tests/cuda/test_vq.cpp).
TEST_CASE("assign_codes breaks ties to the lowest index also across the vectorised lanes and the tail") {
  Tensor e = test::tied_codebook();
  Tensor x = from_vector({1, 0, 1.1f, 0.1f, 0.9f, -0.1f}, {3, 2});
  CHECK(assign_codes(x, e, false).to_vector<int64_t>() == std::vector<int64_t>{35, 35, 35});
}

TEST_CASE("assign_codes handles empty batches and rejects mismatched shapes") {
  Tensor e = ones({4, 3});
  CHECK(assign_codes(zeros({0, 3}), e, false).shape() == Shape{0});
  CHECK_THROWS_WITH_AS(assign_codes(zeros({2, 4}), e, false), doctest::Contains("need shapes [N, D] and [K, D]"), Error);
}

TEST_CASE("l2_normalize_rows gives unit rows and keeps zero rows finite") {
  Tensor x = from_vector({3, 4, 0, 0}, {2, 2});
  x.set_requires_grad(true);
  Tensor y = l2_normalize_rows(x);
  CHECK(y.to_vector<float>() == std::vector<float>{0.6f, 0.8f, 0, 0});
  sum(y).backward();
  for (float g : x.grad().to_vector<float>()) CHECK(std::isfinite(g));
}
