// How vqddp bounds the counts a user gives it: every config key and
// command-line flag reads its integer as a 64-bit value checked against a
// CountRange (engine/core/parse_number.h) before it is narrowed or used. The
// ranges live beside the code that reads them (vq/quantizer_kind.h: the
// quantizers' keys; train/config.h: the run's; tool/cli_args.h and
// tool/check_ddp.h: the flags'); this header holds what they share.
//
// Every upper limit is far above any real run and low enough that products
// of them (codebook_size x codebook_dim x num_quantizers, hidden x hidden)
// fit in int64; a combination too large to allocate is refused by key
// (ConfigSection::check_elements) before any tensor exists.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "engine/core/parse_number.h"

namespace vqddp::limits {

inline constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

// A product of counts, or nullopt when it overflows int64: for combinations
// of counts that are each in range but whose product may not be.
inline std::optional<int64_t> product(const std::vector<int64_t>& factors) {
  int64_t n = 1;
  for (int64_t f : factors)
    if (__builtin_mul_overflow(n, f, &n)) return std::nullopt;
  return n;
}

// Any 64-bit value: for flags whose range the callee checks (launch's, in
// comm/process_launcher.cpp, which knows how they bound each other).
inline constexpr CountRange any{std::numeric_limits<int64_t>::min(), kNoLimit};

// Elements one allocation may hold: 2^31 float32 values are 8 GiB, beyond
// any codebook or layer a model of this kind has; a config asking for more
// is refused by key instead of failing in the allocator.
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 31;

}  // namespace vqddp::limits
