// The allowed range of every count a user gives vqddp, in one place: config
// keys and command-line flags read their integers through these, as 64-bit
// values checked before they are narrowed or used (engine/parse_number.h).
//
// The upper limits are far above any real run and low enough that products
// of them (codebook_size x codebook_dim x num_quantizers, hidden x hidden)
// fit in int64; a combination too large to allocate is refused by name in
// train/config.cpp before any tensor exists.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "engine/parse_number.h"

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

inline constexpr CountRange world{1, 1024};                 // thread ranks; --world, distributed.world_size
inline constexpr CountRange steps{1, int64_t{1} << 40};     // --steps (0 in a config means "use epochs")
inline constexpr CountRange config_steps{0, steps.hi};      // schedule.steps
inline constexpr CountRange epochs{0, int64_t{1} << 30};
inline constexpr CountRange every{0, steps.hi};             // validate_every, checkpoint_every
inline constexpr CountRange log_every{1, steps.hi};
inline constexpr CountRange batch_size{1, int64_t{1} << 24};
inline constexpr CountRange width{1, 65536};                // hidden, latent_dim, codebook_dim, tokens
inline constexpr CountRange codebook_dim{0, width.hi};      // 0: latent_dim
inline constexpr CountRange layers{1, 256};                 // hidden_layers, num_quantizers
inline constexpr CountRange beam{1, 64};                    // beam_size, eval_beam_size
inline constexpr CountRange sample_rate{0, 1'000'000};       // data.sample_rate (0: the first clip's)
inline constexpr CountRange heads{1, 256};                  // quantizer.heads
inline constexpr CountRange conv_stride{1, 64};            // model.strides
inline constexpr CountRange residual_units{0, 16};         // model.residual_units
inline constexpr CountRange codebook_size{2, int64_t{1} << 24};
inline constexpr CountRange fsq_level{2, 65536};
inline constexpr CountRange kmeans_iters{1, 10000};
inline constexpr CountRange frame{1, int64_t{1} << 24};
inline constexpr CountRange holdout_every{2, kNoLimit};
inline constexpr CountRange readers{1, 64};                  // data.readers (threads per rank)
inline constexpr CountRange prefetch{0, 1024};               // data.prefetch (steps read ahead)
inline constexpr CountRange optional_count{0, kNoLimit};    // max_files, max_examples (0: all)
inline constexpr CountRange check_steps{1, 100000};         // check-ddp --steps
inline constexpr CountRange demo_steps{1, 100000000};
inline constexpr CountRange chunk_frames{1, int64_t{1} << 20};  // encode/decode --chunk (model frames)
// Any 64-bit value: for flags whose range the callee checks (launch's, in
// comm/process_launcher.cpp, which knows how they bound each other).
inline constexpr CountRange any{std::numeric_limits<int64_t>::min(), kNoLimit};

// Elements one allocation may hold: 2^31 float32 values are 8 GiB, beyond
// any codebook or layer a model of this kind has; a config asking for more
// is refused by key instead of failing in the allocator.
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 31;

}  // namespace vqddp::limits
