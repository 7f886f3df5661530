// Tensor creation, views, broadcasting values, argmin/argmax ties.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "engine/core/cpu_allocator.h"
#include "engine/ops.h"
#include "engine/core/parse_number.h"
#include "engine/core/random.h"

using namespace vqddp;

TEST_CASE("creation functions give the stated shapes, dtypes and values") {
  CHECK(zeros({2, 3}).to_vector<float>() == std::vector<float>(6, 0.f));
  CHECK(ones({4}).to_vector<float>() == std::vector<float>(4, 1.f));
  CHECK(full({2}, 2.5).to_vector<float>() == std::vector<float>{2.5f, 2.5f});
  CHECK(full({3}, 7, DType::i64).to_vector<int64_t>() == std::vector<int64_t>{7, 7, 7});
  CHECK(arange(4).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(arange(5, 0, -2).to_vector<int64_t>() == std::vector<int64_t>{5, 3, 1});
  CHECK(arange(3, DType::f32).to_vector<float>() == std::vector<float>{0.f, 1.f, 2.f});
  Tensor t = from_vector({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {2, 3});
  CHECK(t.shape() == Shape{2, 3});
  CHECK(t.dtype() == DType::f32);
  CHECK(t.device() == Device::cpu());
  CHECK(t.size(-1) == 3);
  CHECK(scalar(3.f).dim() == 0);
  CHECK(scalar(3.f).item<float>() == 3.f);
  CHECK_THROWS_WITH_AS(from_vector({1.f, 2.f}, {3}), doctest::Contains("2 values for shape [3]"), Error);
  CHECK_THROWS_WITH_AS(t.data<int64_t>(), doctest::Contains("expected a int64 tensor, got float32[2, 3]"), Error);
  CHECK_THROWS_AS(Tensor().shape(), Error);
}

TEST_CASE("random creation draws from the generator reproducibly and in range") {
  Generator g1(5, 0), g2(5, 0);
  Tensor u = rand_uniform({1000}, g1, -2.f, 3.f);
  CHECK(u.to_vector<float>() == rand_uniform({1000}, g2, -2.f, 3.f).to_vector<float>());
  for (float v : u.to_vector<float>()) CHECK((v >= -2.f && v < 3.f));
  Tensor n = rand_normal({20000}, g1, 1.f, 2.f);
  CHECK(mean(n).item<float>() == doctest::Approx(1.0).epsilon(0.05));
  CHECK(std::sqrt(mean(square(sub(n, 1.f))).item<float>()) == doctest::Approx(2.0).epsilon(0.03));
}

TEST_CASE("reshape and slice_rows are views that share storage; transpose copies") {
  Tensor t = arange(12, DType::f32).reshape({3, 4});
  Tensor flat = t.reshape({-1});
  Tensor rows = t.slice_rows(1, 3);
  CHECK(flat.shares_storage(t));
  CHECK(rows.shares_storage(t));
  CHECK(rows.shape() == Shape{2, 4});
  CHECK(rows.to_vector<float>() == std::vector<float>{4, 5, 6, 7, 8, 9, 10, 11});
  rows.fill_(-1.0);  // writes through to t and flat
  CHECK(t.to_vector<float>()[4] == -1.f);
  CHECK(flat.to_vector<float>()[11] == -1.f);
  Tensor tt = transpose(t);
  CHECK_FALSE(tt.shares_storage(t));
  CHECK(tt.shape() == Shape{4, 3});
  CHECK(tt.to_vector<float>()[1] == -1.f);  // tt[0][1] = t[1][0]
  CHECK(t.slice_rows(3, 3).numel() == 0);
  CHECK_THROWS_WITH_AS(t.slice_rows(2, 4), doctest::Contains("slice_rows [2, 4) out of range"), Error);
  CHECK_THROWS_WITH_AS(t.reshape({5, -1}), doctest::Contains("cannot infer"), Error);
  CHECK_THROWS_WITH_AS(t.reshape({5, 2}), doctest::Contains("shape [5, 2] needs 10"), Error);
}

TEST_CASE("transpose of a dimension with itself is a copy") {
  Tensor t = arange(12, DType::f32).reshape({3, 4});
  Tensor u = transpose(t, 1, 1);
  CHECK(u.shape() == t.shape());
  CHECK(u.to_vector<float>() == t.to_vector<float>());
  CHECK_FALSE(u.shares_storage(t));
}

TEST_CASE("shapes whose element count overflows int64 are refused") {
  CHECK_THROWS_WITH_AS(shape_numel({int64_t{1} << 62, 4}), doctest::Contains("more elements than int64 holds"), Error);
  CHECK_THROWS_WITH_AS(zeros({int64_t{1} << 60, 4}), doctest::Contains("too large to allocate"), Error);
  // Representable, but no host has it: an error that says how much, not a bare std::bad_alloc.
  CHECK_THROWS_WITH_AS(zeros({int64_t{1} << 59}), doctest::Contains("cannot allocate 2305843009213693952 bytes on the host"),
                       Error);
}

TEST_CASE("transpose of a 3-d tensor swaps the named dimensions") {
  Tensor t = arange(24, DType::f32).reshape({2, 3, 4});
  Tensor u = transpose(t, 0, 2);  // [4, 3, 2]
  CHECK(u.shape() == Shape{4, 3, 2});
  // u[k][j][i] == t[i][j][k]
  auto pt = t.to_vector<float>(), pu = u.to_vector<float>();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) CHECK(pu[(k * 3 + j) * 2 + i] == pt[(i * 3 + j) * 4 + k]);
}

TEST_CASE("broadcasting: scalar, trailing row, column and outer forms") {
  Tensor a = from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(add(a, 10.f).to_vector<float>() == std::vector<float>{11, 12, 13, 14, 15, 16});
  CHECK(sub(a, from_vector({1, 2, 3}, {3})).to_vector<float>() == std::vector<float>{0, 0, 0, 3, 3, 3});
  CHECK(mul(a, from_vector({2, 10}, {2, 1})).to_vector<float>() == std::vector<float>{2, 4, 6, 40, 50, 60});
  CHECK(div(from_vector({6}, {1}), a).to_vector<float>()[2] == 2.f);
  CHECK(add(from_vector({1, 2}, {2, 1}), from_vector({10, 20, 30}, {3})).to_vector<float>() ==
        std::vector<float>{11, 21, 31, 12, 22, 32});
  CHECK(broadcast_shape({5, 1, 3}, {4, 1}) == Shape{5, 4, 3});
  CHECK_THROWS_WITH_AS(add(a, ones({2})), doctest::Contains("shapes [2, 3] and [2] do not broadcast"), Error);
  CHECK(sum_to_shape(ones({2, 3}), {3}).to_vector<float>() == std::vector<float>{2, 2, 2});
  CHECK(sum_to_shape(ones({2, 3}), {2, 1}).to_vector<float>() == std::vector<float>{3, 3});
}

TEST_CASE("elementwise ops reject int64 tensors with a message naming the op") {
  CHECK_THROWS_WITH_AS(add(arange(3), arange(3)), doctest::Contains("add: expected a float32 tensor, got int64[3]"), Error);
  CHECK_THROWS_WITH_AS(vqddp::exp(arange(3)), doctest::Contains("exp: expected a float32"), Error);
}

TEST_CASE("sum, mean and matmul values") {
  Tensor a = from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(sum(a).item<float>() == 21.f);
  CHECK(sum(a, 0).to_vector<float>() == std::vector<float>{5, 7, 9});
  CHECK(sum(a, 1, true).shape() == Shape{2, 1});
  CHECK(mean(a, -1).to_vector<float>() == std::vector<float>{2, 5});
  CHECK(sum(zeros({0, 3})).item<float>() == 0.f);
  Tensor b = from_vector({1, 0, 0, 1, 1, 1}, {3, 2});
  CHECK(matmul(a, b).to_vector<float>() == std::vector<float>{4, 5, 10, 11});
  CHECK(matmul(b, a, true, true).to_vector<float>() == std::vector<float>{4, 10, 5, 11});
  CHECK(matmul(zeros({0, 3}), b).shape() == Shape{0, 2});
  CHECK(matmul(zeros({2, 0}), zeros({0, 2})).to_vector<float>() == std::vector<float>(4, 0.f));
  CHECK_THROWS_WITH_AS(matmul(a, a), doctest::Contains("inner dimensions differ"), Error);
}

TEST_CASE("argmin and argmax break ties to the lowest index and skip NaN") {
  float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = from_vector({3, 1, 1, 2,   //
                          5, 5, 5, 5,   //
                          nan, 4, 0, 0,  //
                          nan, nan, nan, nan},
                         {4, 4});
  CHECK(argmin(x).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 2, 0});
  CHECK(argmax(x).to_vector<int64_t>() == std::vector<int64_t>{0, 0, 1, 0});
  CHECK(argmin(x).dtype() == DType::i64);
  CHECK(argmin(zeros({2, 3, 5})).shape() == Shape{2, 3});
}

TEST_CASE("concat and index_select values, and their errors") {
  Tensor a = from_vector({1, 2, 3, 4}, {2, 2}), b = from_vector({5, 6}, {1, 2});
  CHECK(concat({a, b}).to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK(concat({a, transpose(b)}, 1).to_vector<float>() == std::vector<float>{1, 2, 5, 3, 4, 6});
  CHECK_THROWS_WITH_AS(concat({a, b}, 1), doctest::Contains("concat: input 1 is float32[1, 2]"), Error);
  Tensor idx = from_vector(std::vector<int64_t>{1, 1, 0}, {3});
  CHECK(index_select(a, idx).to_vector<float>() == std::vector<float>{3, 4, 3, 4, 1, 2});
  CHECK(index_select(arange(5), from_vector(std::vector<int64_t>{4}, {1})).item<int64_t>() == 4);
  CHECK_THROWS_WITH_AS(index_select(a, from_vector(std::vector<int64_t>{2}, {1})),
                       doctest::Contains("index[0] = 2 out of range for 2 rows"), Error);
}

TEST_CASE("large tensors reuse cached host blocks; their contents are not assumed zero") {
  // Measured from after the allocation: an earlier test may have left a
  // block of this size in the cache, which `big` then takes.
  Tensor big = full({1 << 16}, 3.0);  // 256 KiB: cached when freed
  size_t held = cpu_cache_bytes();
  big = Tensor();
  CHECK(cpu_cache_bytes() == held + (1 << 18));
  Tensor again = zeros({1 << 16});  // takes the cached block and zero-fills it
  CHECK(cpu_cache_bytes() == held);
  CHECK(sum(again).item<float>() == 0.f);
}

#if !defined(__SANITIZE_ADDRESS__)  // there blocks are reused at their exact size only
TEST_CASE("a large request takes a cached block of up to twice its size, which gives back its own size") {
  // The cache emptied first, so no other test's block is one a request
  // could take (with an eighth of room above the peak, the cache keeps
  // such blocks: a 64 MiB one took the 33 MiB request here).
  cpu_release_cache();
  const size_t block_bytes = (37 << 20) + (3 << 16), request = 33 << 20;
  void* block = cpu_alloc(block_bytes);
  const size_t held = cpu_cache_bytes();
  cpu_free(block, block_bytes);
  CHECK(cpu_cache_bytes() == held + block_bytes);
  void* p = cpu_alloc(request);  // within twice: the 37 MiB block, not a fresh 33 MiB one
  CHECK(p == block);
  CHECK(cpu_cache_bytes() == held);
  cpu_free(p, request);  // freed under the request's size: the block's own size is what comes back
  CHECK(cpu_cache_bytes() == held + block_bytes);
  const size_t small_bytes = 18 << 20;
  void* small = cpu_alloc(small_bytes);  // more than twice smaller: a block of its own
  CHECK(small != block);
  // and cache + live stay within the peak and an eighth
  CHECK(cpu_cache_bytes() + small_bytes <= cpu_peak_live_bytes() + cpu_peak_live_bytes() / 8);
  cpu_free(small, small_bytes);
}
#endif

TEST_CASE("a step whose sizes' demand sums past the peak keeps its blocks cached: the bound has an eighth of room") {
  // Each step allocates a block `a` and frees it, then a block `b`: the
  // peak is a (with what was live before), but the step needs a and b
  // cached. With the peak as the bound exactly, b's miss returned a (the
  // largest cached block) and every step mapped both again. The cache is
  // emptied first, and a is above the peak so far (never touched: no
  // memory is used), so an eighth of the new peak holds b.
  cpu_release_cache();
  REQUIRE(cpu_cache_bytes() == 0);
  const size_t b = size_t{1} << 20, a = cpu_peak_live_bytes() + 16 * b;
  REQUIRE(a + b <= (size_t{2048} << 20));  // VQDDP_CPU_CACHE_MB's default holds them
  for (int step = 0; step < 3; ++step) {
    CAPTURE(step);
    void* pa = cpu_alloc(a);
    cpu_free(pa, a);
    const size_t held = cpu_cache_bytes();
    void* pb = cpu_alloc(b);
    cpu_free(pb, b);
    CHECK(cpu_cache_bytes() >= held);  // a was not returned to make room for b
  }
  cpu_release_cache();
  CHECK(cpu_cache_bytes() == 0);
}

TEST_CASE("parse_int and parse_double take the whole string or nothing") {
  CHECK(parse_int("42") == 42);
  CHECK(parse_int("-7") == -7);
  CHECK_FALSE(parse_int("3x"));  // std::stoll read this as 3 (replay --shards did)
  CHECK_FALSE(parse_int(" 3"));
  CHECK_FALSE(parse_int(""));
  CHECK_FALSE(parse_int("3.5"));
  CHECK_FALSE(parse_int("99999999999999999999"));  // out of range
  CHECK(parse_double("0.25") == 0.25);
  CHECK(parse_double("1e-3") == 1e-3);
  CHECK_FALSE(parse_double("1.5s"));
  CHECK_FALSE(parse_double(""));
}
