// Sums over the GLOBAL batch: what a loss or a statistic of the whole batch
// needs from the other ranks, and the exact step's gradient reduction.
//
// Inside an exact step (engine/exact_batch.h) each is one reduce_units
// collective over unit partials: the result has the same bits on every rank
// and for any split, and the backward needs no collective (every rank holds
// the global value, so the gradient arriving at it is already the global
// one; each rank passes it to its own rows). Outside one (evaluation, a
// training loop without exact steps), batch_mean is this rank's mean and
// issues no collective, and batch_sum all-reduces (and all-reduces its
// gradient, which is then the global one when each rank backpropagates its
// share N_r / N of the loss).
//
// Sharp edges: every rank must call these in an exact step (and batch_sum
// always), with the same shapes past dimension 0; `comm` must outlive the
// graph.
#pragma once

#include "comm/communicator.h"
#include "engine/exact_batch.h"

namespace vqddp {

// Sum over the rows (dimension 0) of every rank's x: [M, ...] -> [...].
// Differentiable.
Tensor batch_sum(const Tensor& x, Communicator& comm);

// Mean of every element of every rank's x (0, with a zero gradient, when the
// global batch has none): shape []. Differentiable.
Tensor batch_mean(const Tensor& x, Communicator& comm);

// batch_mean of each of xs, the same values, in ONE collective: a loss made
// of many global means (a GAN's feature matching: two per feature map)
// pays one rank barrier instead of one per mean.
std::vector<Tensor> batch_means(const std::vector<Tensor>& xs, Communicator& comm);

// The exact step's reducer: partial stacks [units, ...shape_i] -> global sums
// [shape_i], in one reduce_units call on the stacks as column blocks (no
// copy where the transport needs none). `rank_units`: every rank's
// unit count.
std::vector<Tensor> reduce_unit_partials(Communicator& comm, const std::vector<Tensor>& partials,
                                         const std::vector<int64_t>& rank_units);

// An exact step for this rank of `comm`: its units' example counts and every
// rank's unit count, with reduce_unit_partials as the reducer.
ExactBatch exact_batch_for(Communicator& comm, std::vector<int64_t> unit_examples, std::vector<int64_t> rank_units);

}  // namespace vqddp
