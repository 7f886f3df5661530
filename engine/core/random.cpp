#include "engine/core/random.h"

#include <cmath>
#include <numbers>

#include "engine/core/error.h"

namespace vqddp {

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  constexpr uint64_t kMul0 = 0xD2511F53, kMul1 = 0xCD9E8D57;
  constexpr uint32_t kWeyl0 = 0x9E3779B9, kWeyl1 = 0xBB67AE85;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = kMul0 * c[0], p1 = kMul1 * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
    k[0] += kWeyl0;
    k[1] += kWeyl1;
  }
  return c;
}

uint64_t Generator::rank_stream(uint64_t stream, int rank) {
  VQDDP_CHECK(stream < (uint64_t{1} << 32), "shared stream id {} must be below 2^32", stream);
  VQDDP_CHECK(rank >= 0, "negative rank {}", rank);
  return stream | (static_cast<uint64_t>(rank) + 1) << 32;
}

uint32_t Generator::next_u32() {
  uint64_t block = state_.offset / 4;
  if (block != cached_block_) {
    cached_ = philox4x32_10({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                             static_cast<uint32_t>(state_.stream), static_cast<uint32_t>(state_.stream >> 32)},
                            {static_cast<uint32_t>(state_.seed), static_cast<uint32_t>(state_.seed >> 32)});
    cached_block_ = block;
  }
  return cached_[state_.offset++ % 4];
}

uint64_t Generator::next_u64() {
  uint64_t hi = next_u32();
  return hi << 32 | next_u32();
}

float Generator::uniform() { return static_cast<float>(next_u32() >> 8) * 0x1.0p-24f; }

float Generator::normal() {
  // u1 in (0, 1] so the log is finite; computed in double so the tails do not
  // depend on float rounding.
  double u1 = (static_cast<double>(next_u32()) + 1.0) * 0x1.0p-32;
  double u2 = static_cast<double>(next_u32()) * 0x1.0p-32;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

uint64_t Generator::uniform_int(uint64_t n) {
  VQDDP_CHECK(n > 0, "uniform_int needs n > 0");
  // Lemire's multiply-and-reject: unbiased, usually one 64-bit draw.
  uint64_t x = next_u64();
  unsigned __int128 m = static_cast<unsigned __int128>(x) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    uint64_t threshold = -n % n;
    while (low < threshold) {
      x = next_u64();
      m = static_cast<unsigned __int128>(x) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

std::vector<int64_t> random_permutation(int64_t n, Generator& gen) {
  VQDDP_CHECK(n >= 0, "random_permutation of negative size {}", n);
  std::vector<int64_t> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[gen.uniform_int(static_cast<uint64_t>(i) + 1)]);
  return p;
}

IndexPermutation::IndexPermutation(uint64_t n, uint64_t seed, uint64_t stream, uint32_t tweak)
    : n_(n), seed_(seed), stream_(static_cast<uint32_t>(stream)), tweak_(tweak) {
  VQDDP_CHECK(n <= (uint64_t{1} << 62), "IndexPermutation of {} elements: at most 2^62", n);
  VQDDP_CHECK(stream < (uint64_t{1} << 32), "shared stream id {} must be below 2^32", stream);
  while (half_bits_ < 31 && (uint64_t{1} << (2 * half_bits_)) < n) ++half_bits_;
}

uint64_t IndexPermutation::once(uint64_t x) const {
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  uint64_t left = x >> half_bits_, right = x & mask;
  for (uint32_t round = 0; round < 6; ++round) {
    // High counter word 0xFFFFFFF0 + round: a Generator's stream would need
    // a rank near 2^32 to reach it (Generator::rank_stream).
    const std::array<uint32_t, 4> f =
        philox4x32_10({static_cast<uint32_t>(right), tweak_, stream_, 0xFFFFFFF0u + round},
                      {static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32)});
    const uint64_t next = left ^ ((uint64_t{f[0]} | uint64_t{f[1]} << 32) & mask);
    left = right;
    right = next;
  }
  return left << half_bits_ | right;
}

uint64_t IndexPermutation::operator()(uint64_t i) const {
  VQDDP_CHECK(i < n_, "IndexPermutation: position {} of {}", i, n_);
  uint64_t x = once(i);
  while (x >= n_) x = once(x);
  return x;
}

}  // namespace vqddp
