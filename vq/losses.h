// The small loss and gradient pieces every quantizer shares.
//
// Every mean is over the GLOBAL batch in an exact training step (one
// collective each, comm/batch_reduce.h: every rank gets the same value, and
// the gradient of the global loss), and over this rank's elements otherwise
// (evaluation: no collective). A rank may hold no rows in a step (uneven
// shards, masks): its local means are then 0 with a zero gradient, and they
// stay in the graph so backward runs on every rank alike (mean() of nothing
// is an error, so the *_or_zero forms handle that one case here, once).
#pragma once

#include "comm/communicator.h"
#include "engine/core/tensor.h"

namespace vqddp {

// Collectives in a training step (comm/batch_reduce.h): every rank must
// call them, in the same order, rows or none.
// mean(x) over the global batch, or 0 (keeping x's graph) when x has no elements.
Tensor global_mean_or_zero(const Tensor& x, Communicator& comm);
// mean((a - b)^2), or 0 (keeping both graphs) when they have no elements.
Tensor global_mse_or_zero(const Tensor& a, const Tensor& b, Communicator& comm);

// The mean over the GLOBAL batch's rows of p (M, K) -> (K): one collective
// for the sums and the row count (a column of ones summed with them), the
// gradient the global one; zeros when no rank has rows.
Tensor global_row_mean(const Tensor& p, Communicator& comm);

// z + (q - z).detach(): the values of q with the gradient of z.
Tensor straight_through(const Tensor& z, const Tensor& q);

// weight * mse(q.detach(), z): pulls the encoder output z toward its codes.
// The weight is applied (ESPnet stored it and forgot to).
Tensor commitment_loss(const Tensor& q, const Tensor& z, float weight, Communicator& comm);

// The loss of one codebook's quantization: the commitment loss, plus for a
// learnable codebook the codebook loss mse(q, z.detach()) that trains it
// (VQ-VAE); the straight-through output and the commitment term both detach
// q, so without it a learnable codebook would get no gradient.
Tensor quantization_loss(const Tensor& q, const Tensor& z, float commitment_weight, bool learnable,
                         Communicator& comm);

}  // namespace vqddp
