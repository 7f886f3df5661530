// Counter-based random numbers: Philox 4x32-10 (Salmon et al., SC'11).
//
// A Generator is the triple (seed, stream, offset): the seed is the Philox
// key, the stream and the block number form the 128-bit counter, and offset
// counts the 32-bit words drawn so far. The same triple gives the same
// numbers on every rank, every platform and after a restore, with no hidden
// state. That is what DDP needs (docs/design.md section 6):
//   - a SHARED stream (same seed and stream id on every rank) advances in
//     lockstep because every rank makes the same calls, so ranks agree on a
//     dropout index or a sampler split without any collective;
//   - a RANK-LOCAL stream (rank_stream(stream, rank)) differs per rank.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace vqddp {

// One Philox 4x32-10 block: 4 words from a 128-bit counter and a 64-bit key.
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

struct GeneratorState {
  uint64_t seed = 0;
  uint64_t stream = 0;
  uint64_t offset = 0;  // 32-bit words drawn so far
  bool operator==(const GeneratorState&) const = default;
};

class Generator {
 public:
  explicit Generator(uint64_t seed = 0, uint64_t stream = 0) : state_{seed, stream, 0} {}
  explicit Generator(GeneratorState s) : state_(s) {}

  // Stream id private to `rank`: shared stream ids are below 2^32; rank-local
  // ids set the rank (plus one) in the upper 32 bits, so they never collide.
  static uint64_t rank_stream(uint64_t stream, int rank);

  uint32_t next_u32();
  uint64_t next_u64();               // two words, high word first
  float uniform();                   // [0, 1), 24 random bits
  float normal();                    // standard normal (Box-Muller, one value per two words)
  uint64_t uniform_int(uint64_t n);  // [0, n), unbiased (rejection); n > 0

  GeneratorState state() const { return state_; }
  void set_state(const GeneratorState& s) {
    state_ = s;
    cached_block_ = UINT64_MAX;  // the cached block belongs to the old (seed, stream)
  }
  void advance(uint64_t words) { state_.offset += words; }

 private:
  GeneratorState state_;
  uint64_t cached_block_ = UINT64_MAX;
  std::array<uint32_t, 4> cached_{};
};

// A uniformly random permutation of 0..n-1 (Fisher-Yates).
std::vector<int64_t> random_permutation(int64_t n, Generator& gen);

// A keyed permutation of 0..n-1 evaluated one position at a time, in O(1)
// memory: where random_permutation needs n words (a sampler's epoch of a
// corpus larger than memory would not fit), this is a pure function of
// (seed, stream, tweak, i). A balanced Feistel network of 6 rounds over the
// smallest even number of bits that holds n (each round's function one
// Philox block keyed by the seed), then cycle-walking: a result >= n is
// permuted again until it falls below n, which ends because a permutation's
// cycle through i returns to i < n; the domain is under 4n, so it takes
// under 4 rounds of the network on average. Its counters never coincide
// with a Generator's (their high word is reserved), so a permutation and a
// Generator on the same seed and stream draw unrelated bits.
class IndexPermutation {
 public:
  // n in [0, 2^62]; `stream` a shared stream id (below 2^32, engine/core/streams.h);
  // `tweak` tells apart permutations of one stream.
  IndexPermutation(uint64_t n, uint64_t seed, uint64_t stream, uint32_t tweak = 0);
  uint64_t operator()(uint64_t i) const;  // i < n
  uint64_t size() const { return n_; }

 private:
  uint64_t once(uint64_t x) const;  // the network over 2 * half_bits_ bits
  uint64_t n_, seed_;
  uint32_t stream_, tweak_;
  int half_bits_ = 1;
};

}  // namespace vqddp
