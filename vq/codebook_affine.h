// vector-quantize-pytorch's affine_param on a Euclidean codebook: the codes
// are used in the space of the batch, shifted and scaled per dimension by
// EMAs of the batch's and the codebook's mean and (biased) variance:
//   codes' = (embed - cm) * (bstd / cstd) + bm,   std = sqrt(max(var, 1e-5))
// and the EMA update sees the rows mapped back, (x - bm) * (cstd / bstd) +
// cm. The statistics move in training steps: the codebook's (decay
// affine_param_codebook_decay, 0.9) from its codes, the batch's (decay
// affine_param_batch_decay, 0.99) from the rows; each EMA starts from its
// first value.
//
// DDP: the batch's mean and variance are the GLOBAL batch's, always (the
// reference's sync_affine_param, off by default there, so its ranks' codes
// drift apart): exact sums of every rank's rows on the grid of
// vq/code_stats.h, all-reduced, the variance a second pass around the global
// mean; W ranks on any split, added in any order, give 1 rank's bits. The rows are summed on the host (a read-back on a device, a
// documented cost of the option). The reference also moves the batch
// statistics in eval; here eval changes no state.
#pragma once

#include "comm/communicator.h"
#include "engine/nn.h"

namespace vqddp {

// A submodule of the codebook ("affine"): buffers batch_mean,
// batch_variance, codebook_mean, codebook_variance (D each) and the flags
// batch_needs_init, codebook_needs_init.
class CodebookAffine : public Module {
 public:
  CodebookAffine(int64_t dim, float batch_decay, float codebook_decay);

  // Moves the statistics by this training step's rows x (M, D, this rank's)
  // and the codes `embed` (K, D). A collective: every rank calls.
  void update(const Tensor& x, const Tensor& embed, Communicator& comm);
  // codes' and rows mapped back, as above (differentiable in embed).
  Tensor to_batch_space(const Tensor& embed) const;
  Tensor to_codebook_space(const Tensor& x) const;

  Tensor batch_mean, batch_variance, codebook_mean, codebook_variance;
  Tensor batch_needs_init, codebook_needs_init;  // int64 (1)

 private:
  float batch_decay_ = 0.99f, codebook_decay_ = 0.9f;
};

}  // namespace vqddp
