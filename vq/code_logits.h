// The logits of rows against a codebook as vector-quantize-pytorch's
// Codebook returns them (its `distances`), and the two losses built on
// them: the codebook diversity loss (vq/codebook_diversity.h) and the
// cross-entropy commitment loss (commitment_use_cross_entropy_loss).
//
//   s_nk = -sqrt(max(|x_n|^2 - 2 x_n.e_k + |e_k|^2, 1e-8))   (Euclidean: the
//          reference's cdist, whose clamp also keeps the root's gradient finite)
//   s_nk = x_n . e_k                                           (cosine: unit rows)
//
// Row n's logits depend on row n alone, so both losses keep W ranks == 1 rank.
#pragma once

#include "comm/communicator.h"
#include "engine/core/tensor.h"
#include "vq/codebook.h"

namespace vqddp {

// rows (M, D) with their graph; codes (K, D). Returns (M, K).
Tensor code_logits(const Tensor& rows, const Tensor& codes, bool cosine);

// The codes of `book` as its assignment `a` saw them, for a loss computed
// before the step's update (which writes an EMA codebook in place): a copy,
// batch-free; a learnable codebook's own codes (its loss reaches the embed).
Tensor assigned_codebook(const Codebook& book);

// commitment_use_cross_entropy_loss: the mean over the GLOBAL batch's rows
// of cross_entropy(s_n, index_n) = logsumexp_k s_nk - s_n,index_n (one
// collective; 0 when no rank has rows). indices (M) int64 in [0, K).
Tensor code_cross_entropy(const Tensor& rows, const Tensor& codes, bool cosine, const Tensor& indices,
                          Communicator& comm);

}  // namespace vqddp
