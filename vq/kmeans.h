// Distributed k-means (docs/design.md section 3): the same means on every
// rank with no broadcast, because every rank computes them from the same
// all-reduced statistics.
//   1. Initial means: K rows of the global batch from the sampler.
//   2. Each iteration: assign locally; all_reduce SUM of the fused
//      [counts | sums] buffer; means = sums / counts where counts > 0, the
//      old mean where a cluster is empty. Summing before dividing keeps the
//      numerics of one rank on the whole batch.
//   3. Cosine k-means assigns by dot product and re-normalises the means.
// Every rank must call (also with 0 rows). If no rank has rows the result
// is undefined tensors on every rank alike.
#pragma once

#include "comm/communicator.h"
#include "engine/core/random.h"

namespace vqddp {

struct KmeansResult {
  Tensor means;  // (K, D)
  Tensor bins;   // (K) float32: global counts of the last assignment
};

KmeansResult kmeans(const Tensor& x, int64_t k, int iters, bool cosine, Communicator& comm, Generator& shared);

}  // namespace vqddp
