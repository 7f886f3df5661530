// Shared random stream ids, one disjoint range per purpose, so that two
// purposes keyed by the same seed never draw the same bits (a model seeded
// 0 and its first codebook seeded 0 must not see correlated numbers).
// Every id stays below 2^32, the shared range (engine/core/random.h).
#pragma once

#include <cstdint>

namespace vqddp::streams {

constexpr uint64_t kInit = 0;                    // initial weights
constexpr uint64_t kQuantizeDropout = 0x10000000;  // + training step
constexpr uint64_t kCodebookDraws = 0x20000000;    // + draw number (k-means init, revival)
constexpr uint64_t kPerturbation = 0x30000000;     // + training step (FSP's in-bin perturbations)
constexpr uint64_t kDiscriminatorInit = 0x40000000;    // a GAN's discriminators' initial weights
constexpr uint64_t kDiscriminatorUpdate = 0x41000000;  // + training step (whether the discriminators update)
constexpr uint64_t kSampler = 0x5A000000;          // + epoch (the epoch's order of its examples)
constexpr uint64_t kSamplerRows = 0x5B000000;      // + epoch (the rows each source gives the epoch)

}  // namespace vqddp::streams
