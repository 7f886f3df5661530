// The one formula every host backend reduces with: for each element, the
// ranks' values combined in ascending rank order, ((x0 + x1) + x2) + ...,
// then divided by W for avg. (Or in another order a run asks for, see
// ReduceOrder: NCCL fixes none, so the exact design must not need one.) The thread backend (every rank's buffer in one
// process) and the MPI backend (each process reducing its slice from the
// ranks' copies) call the same code, so a run on N processes gives the bits
// of N thread ranks. An element's result depends only on its W inputs, never
// on how the elements were split among ranks or blocks.
// Internal header: not installed with the library (the backends' rank-order rule).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "comm/communicator.h"
#include "engine/unit_sum.h"  // ordered_unit_sum: the reduce_units arithmetic

namespace vqddp {

// [begin, end) of the n elements rank `rank` reduces, in 16-element blocks
// so two ranks never write the same cache line of a float buffer.
inline std::pair<int64_t, int64_t> rank_share(int64_t n, int rank, int world) {
  int64_t blocks = (n + 15) / 16;
  int64_t b0 = blocks * rank / world, b1 = blocks * (rank + 1) / world;
  return {std::min(n, b0 * 16), std::min(n, b1 * 16)};
}

// The order in which the host backends (thread, MPI) add the ranks'
// values: ascending by default. VQDDP_REDUCE_ORDER=descending or rotate:K
// (read once per process; set_reduce_order in tests) adds them in another
// order, as NCCL's rings and trees do, to show that a run does not depend on
// it: every sum the design makes exact (the codebook statistics on their
// grid, integer counts; the gradients go through reduce_units, which fixes
// its own order) gives the same bits.
struct ReduceOrder {
  bool descending = false;
  int rotate = 0;  // then position p takes rank (p' + rotate) mod W
};
ReduceOrder parse_reduce_order(const std::string& text);  // throws naming the variable
ReduceOrder reduce_order();
void set_reduce_order(ReduceOrder order);
// The rank added at `position` (0 first) in a world of `world`.
int rank_at(const ReduceOrder& order, int position, int world);

namespace detail {

// Works in cache-sized blocks: a block of rank 0 is combined with rank 1's,
// then rank 2's, ..., so the inner loops vectorise (element by element, no
// reassociation: -ffp-contract=off and no fast-math).
template <class T, class Combine>
void reduce_blocks(const std::vector<const T*>& in, const std::vector<T*>& out, int64_t begin, int64_t end,
                   Combine combine, bool average) {
  constexpr int64_t kBlock = 2048;
  T acc[kBlock];
  int world = static_cast<int>(in.size());
  for (int64_t b = begin; b < end; b += kBlock) {
    int64_t n = std::min(kBlock, end - b);
    std::memcpy(acc, in[0] + b, n * sizeof(T));
    for (int r = 1; r < world; ++r) {
      const T* src = in[r] + b;
      for (int64_t i = 0; i < n; ++i) acc[i] = combine(acc[i], src[i]);
    }
    if constexpr (std::is_floating_point_v<T>)
      if (average)
        for (int64_t i = 0; i < n; ++i) acc[i] = acc[i] / static_cast<T>(world);
    for (T* o : out) std::memcpy(o + b, acc, n * sizeof(T));
  }
}

}  // namespace detail

// Reduces elements [begin, end) of the W inputs (one per rank, in rank
// order) into every buffer of `out` (at the same offsets), combining the
// ranks in reduce_order()'s order.
template <class T>
void rank_ordered_reduce(const std::vector<const T*>& in_rank_order, const std::vector<T*>& out, int64_t begin,
                         int64_t end, ReduceOp op) {
  const ReduceOrder order = reduce_order();
  const int world = static_cast<int>(in_rank_order.size());
  std::vector<const T*> in(in_rank_order.size());
  for (int p = 0; p < world; ++p) in[p] = in_rank_order[rank_at(order, p, world)];
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return detail::reduce_blocks(in, out, begin, end, [](T a, T b) { return a + b; }, op == ReduceOp::avg);
    case ReduceOp::max:
      return detail::reduce_blocks(in, out, begin, end, [](T a, T b) { return std::max(a, b); }, false);
    case ReduceOp::min:
      return detail::reduce_blocks(in, out, begin, end, [](T a, T b) { return std::min(a, b); }, false);
  }
}

}  // namespace vqddp
