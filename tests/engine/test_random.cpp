// Philox known answers, stream reproducibility/independence, exact restore.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>

#include "engine/core/error.h"
#include "engine/core/random.h"

using namespace vqddp;

TEST_CASE("philox4x32_10 matches the Random123 known-answer vectors") {
  using A4 = std::array<uint32_t, 4>;
  CHECK(philox4x32_10({0, 0, 0, 0}, {0, 0}) == A4{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}) ==
        A4{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}) ==
        A4{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE("the same (seed, stream) gives the same sequence; other streams and seeds differ") {
  auto draw = [](Generator g) {
    std::vector<uint32_t> v;
    for (int i = 0; i < 64; ++i) v.push_back(g.next_u32());
    return v;
  };
  CHECK(draw(Generator(42, 3)) == draw(Generator(42, 3)));
  CHECK(draw(Generator(42, 3)) != draw(Generator(42, 4)));
  CHECK(draw(Generator(42, 3)) != draw(Generator(43, 3)));
  // Rank-local streams: distinct per rank and from the shared stream.
  std::set<std::vector<uint32_t>> seen{draw(Generator(42, 3))};
  for (int r = 0; r < 8; ++r) seen.insert(draw(Generator(42, Generator::rank_stream(3, r))));
  CHECK(seen.size() == 9);
  CHECK_THROWS_AS(Generator::rank_stream(uint64_t{1} << 32, 0), Error);
}

TEST_CASE("generator state saves and restores exactly, also mid-block") {
  Generator g(7, 1);
  for (int i = 0; i < 5; ++i) g.next_u32();  // offset 5: inside the second block
  g.normal();
  GeneratorState saved = g.state();
  std::vector<float> expect;
  for (int i = 0; i < 10; ++i) expect.push_back(g.uniform());
  Generator restored(saved);
  std::vector<float> got;
  for (int i = 0; i < 10; ++i) got.push_back(restored.uniform());
  CHECK(got == expect);
  // A generator whose cached block has the same number but another seed and
  // stream must not serve words from that cache after set_state.
  Generator other(999, 5);
  for (int i = 0; i < 5; ++i) other.next_u32();  // caches block 1 of (999, 5)
  other.set_state(saved);                         // saved is at offset 7: block 1 too
  CHECK(other.uniform() == expect[0]);
}

TEST_CASE("advance skips exactly the given number of words") {
  Generator a(9, 2), b(9, 2);
  for (int i = 0; i < 7; ++i) a.next_u32();
  b.advance(7);
  CHECK(a.next_u32() == b.next_u32());
}

TEST_CASE("uniform is in [0, 1), uniform_int in [0, n) and roughly flat") {
  Generator g(1, 0);
  std::vector<int> bins(10, 0);
  for (int i = 0; i < 100000; ++i) {
    float u = g.uniform();
    REQUIRE((u >= 0.f && u < 1.f));
    ++bins[g.uniform_int(10)];
  }
  for (int c : bins) CHECK(std::abs(c - 10000) < 500);  // > 5 sigma away would fail
  CHECK(g.uniform_int(1) == 0);
  CHECK_THROWS_AS(g.uniform_int(0), Error);
}

TEST_CASE("random_permutation is a permutation and depends only on the generator") {
  Generator a(3, 0), b(3, 0);
  auto p = random_permutation(1000, a);
  CHECK(p == random_permutation(1000, b));
  auto sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) CHECK(sorted[i] == i);
  CHECK(p != sorted);
  CHECK(random_permutation(0, a).empty());
}

TEST_CASE("IndexPermutation is a permutation, a pure function of (seed, stream, tweak), and looks shuffled") {
  for (uint64_t n : {1ull, 2ull, 3ull, 5ull, 16ull, 17ull, 1000ull, 4097ull, 65536ull}) {
    CAPTURE(n);
    IndexPermutation p(n, 7, 12, 3);
    std::vector<char> seen(n, 0);
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t x = p(i);
      REQUIRE(x < n);
      CHECK(!seen[x]);
      seen[x] = 1;
    }
    if (n < 1000) continue;
    // Another seed, stream or tweak gives another order; the same gives the same.
    IndexPermutation same(n, 7, 12, 3), seed(n, 8, 12, 3), stream(n, 7, 13, 3), tweak(n, 7, 12, 4);
    int fixed = 0, differ_seed = 0, differ_stream = 0, differ_tweak = 0, ascending = 0;
    for (uint64_t i = 0; i < n; ++i) {
      CHECK(same(i) == p(i));
      fixed += p(i) == i;
      differ_seed += seed(i) != p(i);
      differ_stream += stream(i) != p(i);
      differ_tweak += tweak(i) != p(i);
      if (i > 0) ascending += p(i) > p(i - 1);
    }
    // A uniform permutation fixes about 1 point and ascends about half the time.
    CHECK(fixed < 10);
    CHECK(differ_seed > static_cast<int>(n) * 9 / 10);
    CHECK(differ_stream > static_cast<int>(n) * 9 / 10);
    CHECK(differ_tweak > static_cast<int>(n) * 9 / 10);
    CHECK(std::abs(ascending - static_cast<int>(n) / 2) < static_cast<int>(n) / 20);
  }
  // Large domains cost O(1) memory: positions far apart, no table.
  IndexPermutation big(uint64_t{1} << 40, 1, 2);
  CHECK(big(0) != big(1));
  CHECK(big((uint64_t{1} << 40) - 1) < (uint64_t{1} << 40));
  CHECK_THROWS_AS(big(uint64_t{1} << 40), Error);
  CHECK_THROWS_AS(IndexPermutation(1, 0, uint64_t{1} << 32), Error);
}
