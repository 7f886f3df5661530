// vector-quantize-pytorch's orthogonal regulariser (orthogonal_reg_weight,
// arXiv 2112.00384 eq. 2) on a learnable codebook:
//   loss = sum_ij cos(e_i, e_j)^2 / n^2 - 1 / n
// over n codes: all of them, or (orthogonal_reg_active_codes_only) those
// some row of the GLOBAL batch chose this step, in ascending order (one
// all-reduce of the K counts; the reference takes each rank's own), then
// (orthogonal_reg_max_codes) a random subset of that many, the first of a
// permutation drawn from the codebook's shared stream, so every rank picks
// the same codes (the reference draws per rank). The loss is built from the
// codebook alone (batch-free): every rank computes the same value, and it
// joins the losses as the global mean of that value over the rows, so its
// gradient is counted once for the global batch.
#pragma once

#include "comm/communicator.h"
#include "engine/core/tensor.h"
#include "vq/codebook.h"

namespace vqddp {

// codes (n, D) -> scalar.
Tensor orthogonal_loss(const Tensor& codes);

// The regulariser of `book` for this step's `indices` (M, this rank's).
// A collective when active_only or max_codes is set (every rank calls).
// max_codes 0: no limit. An empty set of codes gives 0.
Tensor orthogonal_regularizer(Codebook& book, const Tensor& indices, bool active_only, int64_t max_codes,
                              Communicator& comm);

}  // namespace vqddp
