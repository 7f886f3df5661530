// The small loss and gradient pieces every quantizer shares.
//
// A rank may hold no rows in a step (uneven shards, masks). Its losses are
// then 0 with a zero gradient, and they stay in the graph so backward (and
// the gradient all-reduce after it) runs on every rank alike: mean() of
// nothing is an error, so the *_or_zero forms handle that one case here,
// once, instead of at every call site.
#pragma once

#include "engine/tensor.h"

namespace vqddp {

// mean(x), or 0 (keeping x's graph) when x has no elements.
Tensor mean_or_zero(const Tensor& x);
// mean((a - b)^2), or 0 (keeping both graphs) when they have no elements.
Tensor mse_or_zero(const Tensor& a, const Tensor& b);

// z + (q - z).detach(): the values of q with the gradient of z.
Tensor straight_through(const Tensor& z, const Tensor& q);

// weight * mse(q.detach(), z): pulls the encoder output z toward its codes.
// The weight is applied (ESPnet stored it and forgot to).
Tensor commitment_loss(const Tensor& q, const Tensor& z, float weight);

// The loss of one codebook's quantization: the commitment loss, plus for a
// learnable codebook the codebook loss mse(q, z.detach()) that trains it
// (VQ-VAE); the straight-through output and the commitment term both detach
// q, so without it a learnable codebook would get no gradient.
Tensor quantization_loss(const Tensor& q, const Tensor& z, float commitment_weight, bool learnable);

}  // namespace vqddp
