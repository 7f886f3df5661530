// vector-quantize-pytorch's codebook diversity loss (VectorQuantize's
// codebook_diversity_loss_weight): minus the entropy of the average code
// probability, which a codebook minimises by spreading its use.
//
//   s_nk = code_logits (vq/code_logits.h): minus the distance, or the cosine
//   p_n = softmax(temperature * s_n)           (N, K)
//   loss = -H(mean_n p_n), H with log's argument clamped at 1e-5
//
// The mean is over the GLOBAL batch (vq/losses.h global_row_mean: one
// collective, the global gradient); the reference averages each rank's rows
// alone, so its loss differs per rank. Masked rows are not in it (the
// reference averages them in). The distance is computed from the same codes
// the rows were assigned against, before the step's update.
#pragma once

#include "comm/communicator.h"
#include "engine/core/tensor.h"
#include "vq/codebook.h"

namespace vqddp {

// rows (M, D): the codebook's prepared input (cosine: unit rows, with their
// graph); codes (K, D) as Codebook::codes(). A collective: every rank calls,
// also with M = 0.
Tensor codebook_diversity_loss(const Tensor& rows, const Tensor& codes, bool cosine, float temperature,
                               Communicator& comm);

// The loss of `book`'s assignment `a` (Codebook::nearest), against the
// codes as they are now: call it before the step's update, which writes an
// EMA codebook's codes in place (the loss keeps a copy).
Tensor codebook_diversity_loss(const Codebook& book, const CodebookAssignment& a, float temperature,
                               Communicator& comm);

}  // namespace vqddp
