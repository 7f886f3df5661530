// Beam search over the layers of a residual quantizer (vector-quantize-
// pytorch's ResidualVQ beam_size): instead of each layer's nearest code,
// keep per row the `beam` paths of lowest score, where a path's score is
// the sum over its layers of w_l * mean_d (code - residual)^2 (the
// reference's per-row commitment loss without commitment_weight: a positive
// weight scales every candidate alike; at 0 the reference's scores all tie
// and its topk keeps whatever it returns first, while here the distances
// still rank), extend each path by its `beam` nearest
// codes in the next layer, and end with the best path.
//
// Row-local: a row's path depends on its own input and the codebooks only,
// so the search cannot depend on the batch, its split or the rank count.
// It runs on the host in double (its distances are not the forward's
// float scores: near ties may go another way than the greedy assignment,
// which is why beam 1 never runs here). Ties go to the earlier beam, then
// the nearer code, then the lower code index.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/core/tensor.h"

namespace vqddp {

struct BeamSearchOptions {
  int beam = 2;                 // paths kept per row (> 1)
  std::vector<float> weights;   // w_l per layer searched
  bool cosine = false;          // unit residuals against unit codes (use_cosine_sim)
};

// z: the rows (M, D); codebooks: each layer's codes (K_l, D) as the forward
// uses them (cosine: unit rows), one per layer searched. Any device (read
// back to the host). Returns int64 (M, layers) on the host: the best path.
Tensor beam_search(const Tensor& z, const std::vector<Tensor>& codebooks, const BeamSearchOptions& o);

}  // namespace vqddp
