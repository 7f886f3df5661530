// The distributed sampler: m rows drawn from the GLOBAL batch, the same
// [m, D] block on every rank, whatever the split of the batch over ranks.
//
// docs/design.md section 4. A simpler scheme splits m over ranks with a
// shared multinomial and lets each rank draw its share from a rank-local
// stream. That keeps ranks consistent, but the rows drawn then depend on
// how the batch is split, so W ranks could not reproduce 1 rank for k-means
// init and dead-code revival (invariant 2). This sampler is split-invariant:
//   1. all_gather of the row counts n_r (ranks with 0 rows take part);
//      N = sum n_r. If N == 0 every rank returns an empty block, alike.
//   2. m GLOBAL row numbers in [0, N) (rows numbered in rank order) are
//      drawn from the SHARED stream: without replacement when N >= m,
//      with replacement otherwise. Every rank computes the same list, so
//      each rank's share is an exact integer count, with nothing left over
//      for a float residue to lose (vector-quantize-pytorch #205).
//   3. Each rank copies the drawn rows it owns, in ascending global order;
//      all_gather_rows concatenates them in rank order, which is ascending
//      global order; every rank then puts the block back in draw order.
// The result depends only on the global batch and the stream, so 1 rank and
// W ranks draw bit-identical rows.
#pragma once

#include "comm/communicator.h"
#include "engine/core/random.h"

namespace vqddp {

// x (n_r, D) on this rank -> (m, D), identical on every rank; (0, D) when no
// rank has rows. Every rank must call with the same m and a generator in
// the same state (a shared stream); it advances identically on all ranks.
Tensor sample_rows(const Tensor& x, int64_t m, Communicator& comm, Generator& shared);

// The m global row numbers drawn from [0, n), in draw order (exposed for
// tests).
std::vector<int64_t> draw_row_numbers(int64_t n, int64_t m, Generator& shared);

}  // namespace vqddp
