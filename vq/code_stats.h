// Per-code statistics of one batch: how many rows chose each code, the sum
// of those rows, and each rank's non-finite flag.
//
// They are returned in ONE float64 buffer (StatsLayout: counts, then the
// sums row by row, then one flag per rank, then the number of codes the
// step revived, which the revival writes after the all-reduce) so the
// codebook reduces them across ranks with a single all_reduce.
//
// The sums are EXACT, so nothing depends on their order: each value is
// rounded to a grid agreed by every rank (kernel_math.h grid_quantum, from
// the largest |value| of all ranks' rows: grid_scale, one max all-reduce),
// and sums of grid values are integers times a power of two that float64
// holds exactly. So the totals depend only on the global batch's rows: not
// on how they were split over ranks, not on the order a backend adds the
// ranks (NCCL fixes none), not on the device (the GPU's chunked sums give
// the CPU's bits). Counts are exact integers.
//
// The flags make a non-finite input a fact every rank learns in the same
// collective: rank r writes 1 + the flat position of its first bad element
// (0 if none) into its slot,
// the others 0, and after the SUM every rank holds every rank's answer, so
// all ranks refuse the step alike (the update kernels then change nothing)
// and the error names the rank and the row. On a device the flags are read
// with the step's metrics, not before the update: no wait in the step.
#pragma once

#include <string>
#include <tuple>

#include "engine/core/tensor.h"

namespace vqddp {

class Communicator;

struct StatsLayout {
  int64_t k = 0, d = 0;  // codes, and columns summed (0: counts only)
  int world = 1;         // ranks (one flag each)
  int64_t cols = 0;      // columns of the input rows (a flag names the element's row and column)

  int64_t sums() const { return k; }
  int64_t flag(int rank) const { return k + k * d + rank; }
  int64_t revived() const { return k + k * d + world; }  // written by the revival, after the all-reduce
  int64_t size() const { return revived() + 1; }

  // Every field, once (engine/device.h's BroadcastPlan::fields).
  auto fields() const {
    const auto& [k_, d_, world_, cols_] = *this;
    return std::tuple(k_, d_, world_, cols_);
  }
};

// The exact-sum grid's scale for the row sets `xs` (float32, one device):
// the largest finite |value| in them, over every rank of `comm` (one max
// all_reduce of one float64; none when comm is null: this rank's rows
// only). A [1] float64 tensor on the rows' device, read by the kernels, never
// by the host. Every rank must call when comm is given.
Tensor grid_scale(const std::vector<Tensor>& xs, Communicator* comm);

// x (N, D), indices (N) int64 in [0, K) from our own assignment (not
// checked again: they are trusted) -> stats (layout.size()) on x's device.
// With layout.d == 0 only the counts (and the flag) are gathered; x may then
// be (N, 0) and `grid` is not needed. Otherwise `grid` is grid_scale of
// rows including x, agreed by the ranks whose stats are summed: without it
// the sums are plain float64 sums of the rows, which the ranks' order can
// change.
Tensor code_stats(const Tensor& x, const Tensor& indices, const StatsLayout& layout, int rank,
                  const Tensor& grid = Tensor());

// The error text for ranks' non-finite flags (`world` of them, 1 + flat
// position or 0, in rows of `cols` columns), or "" when none is set.
// `input` names what the rows are ("the codebook's input").
std::string nonfinite_flags_message(const double* flags, int world, int64_t cols,
                                    const std::string& input = "the codebook's input");
// Reads the flags of all-reduced stats (one counted read on a device) and
// throws NonFiniteError naming every flagged rank and row.
void check_nonfinite_flags(const Tensor& stats, const StatsLayout& layout);

}  // namespace vqddp
