// A differentiable all_reduce(sum): for terms that depend on statistics of
// the GLOBAL batch (LFQ's codebook entropy uses the globally averaged code
// probabilities).
//
// Forward: out = sum over ranks of x. Backward: the gradient of x on each
// rank is the sum over ranks of the gradients arriving at out. That is the
// exact global gradient when each rank backpropagates its share of the
// global loss (its local mean loss scaled by N_r / N, gradients then summed
// across ranks), which is how the DDP layer weights uneven shards.
//
// Sharp edges: every rank must run backward through it (it issues a
// collective), and `comm` must outlive the graph.
#pragma once

#include "comm/communicator.h"

namespace vqddp {

Tensor all_reduce_sum_grad(const Tensor& x, Communicator& comm);

}  // namespace vqddp
