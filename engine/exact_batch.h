// Exact data parallelism: a training step whose every sum over the batch
// has the same bits on any number of ranks, any split, thread count, ISA,
// OpenBLAS core or device (docs/design.md, "Every reduction over the batch
// is split-invariant").
//
// The rule, in one place:
//   1. A global batch is cut into UNITS, runs of consecutive examples fixed
//      by global position alone (train/schedule.h decides how many examples
//      a unit holds); a rank's shard is always whole units, in global order.
//   2. Every sum over the batch is first taken per unit, by a kernel whose
//      result depends on the unit's rows only (the fixed-order GEMM chain of
//      engine/cpu/fixed_gemm.h, the ascending double sums of the reductions): a unit's
//      partial has the same bits whichever rank holds it.
//   3. The partials of all units are added in global unit order, in double,
//      and rounded to float32 once (Communicator::reduce_units). The order
//      never depends on the split, so neither do the bits.
// Per-row results (activations, input gradients) need no rule beyond
// batch invariance: the forward kernels give it, and backward products of
// batched operands use the fixed-order GEMM too while a step is exact.
//
// How autograd applies it. A tensor is BATCH-FREE when it is a parameter (a
// leaf that requires grad), a constant (mark_batch_free), or an op's output
// whose every input is batch-free (weight norm, reshapes of a weight): its
// value is the same on every rank. Everything else is BATCHED: dimension 0
// of a batched tensor runs over its rank's examples, example-major (the
// rows of one example together, the same count for every example).
// Where a batched op consumes a batch-free input, the input's gradient is a
// sum over the batch: inside an ExactBatchScope, backward() asks the op for
// it as UNIT PARTIALS [units, ...input shape] (wants_unit_partials), hands
// every such boundary's partials to the scope's reducer (one collective),
// and only then backpropagates the global sums through the batch-free graph
// to the parameters. Every rank thus ends backward() with the gradient of
// the global loss, bit for bit what one rank computes on the whole batch.
#pragma once

#include <functional>
#include <vector>

#include "engine/core/tensor.h"

namespace vqddp {

// Adds each partial stack [units, ...shape] over the units of the GLOBAL
// batch (every rank's, in global order) and returns the sums [shape], the
// same bits on every rank. Every rank calls it with its tensors in the same
// order (a collective). The sums are the caller's: backward() makes them the
// parameters' .grad without a copy, so a reducer keeps no reference to them.
using UnitReducer = std::function<std::vector<Tensor>(const std::vector<Tensor>& partials)>;

struct ExactBatch {
  std::vector<int64_t> unit_examples;  // examples in each of this rank's units, in global order
  std::vector<int64_t> rank_units;     // units of every rank (length W): what a collective by units gathers
  UnitReducer reduce;                  // what backward() hands the unit partials to
  int64_t examples() const;            // this rank's examples: the sum of unit_examples
};

// The exact step of this thread (ranks are threads), or null outside one.
const ExactBatch* exact_batch();

// Makes `batch` this thread's exact step while it lives (not nestable).
class ExactBatchScope {
 public:
  explicit ExactBatchScope(ExactBatch batch);
  ~ExactBatchScope();
  ExactBatchScope(const ExactBatchScope&) = delete;
  ExactBatchScope& operator=(const ExactBatchScope&) = delete;

 private:
  ExactBatch batch_;
};

// Row bounds of this rank's units in a batched tensor of `rows` rows
// (units + 1 entries, from 0 to rows); throws naming `op` and the tensor when
// its rows are not a whole number per example.
std::vector<int64_t> unit_row_bounds(const Tensor& batched, const char* op);

// The sum over each unit's rows of g, summed down to `shape` as
// sum_to_shape does (ascending double sums): [units, ...shape].
Tensor unit_sum_to_shape(const Tensor& g, const Shape& shape, const char* op);

// Stacks one tensor of `shape` per unit into [units, ...shape].
Tensor stack_units(const std::vector<Tensor>& parts, const Shape& shape, Device device);

}  // namespace vqddp
