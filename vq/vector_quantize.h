// VectorQuantize: the module users put in their models.
//
//   x (N, dim) -> [project_in] -> (N, heads * codebook_dim)
//     -> heads: (N * heads, codebook_dim) rows through ONE shared codebook,
//        or head h's rows through codebook h (separate_codebook_per_head)
//     -> quantize -> straight-through: x + (q - x).detach()
//     -> [project_out] -> (N, dim)
// Masked rows (mask 0) are removed before anything else: they reach no
// codebook statistic, no k-means, no sampler; their output is their input
// and their indices are -1.
//
// loss = commitment_weight * mse(q.detach(), z) over the unmasked rows of
// this rank (z = the codebook input), plus, for learnable codebooks, the
// codebook loss mse(q, z.detach()) that trains the embed (VQ-VAE). The
// weight is applied (ESPnet stored it and forgot to). Losses are means over
// this rank's UNMASKED rows: with masks, scale a rank's share of the global
// loss by its unmasked row count, not by its row count.
#pragma once

#include <memory>
#include <vector>

#include "vq/codebook.h"
#include "vq/quantizer.h"

namespace vqddp {

struct VectorQuantizeOptions {
  int64_t dim = 0;
  int64_t codebook_size = 512;
  int64_t codebook_dim = 0;  // 0: dim / heads
  int heads = 1;
  bool separate_codebook_per_head = false;
  float commitment_weight = 1.f;
  // The gradient through the quantizer in training (vq/rotation_trick.h):
  // the rotation trick, vector-quantize-pytorch's default, or straight-through.
  bool rotation_trick = true;
  // The codebook diversity loss (vq/codebook_diversity.h), added to the loss
  // with this weight in a training step; 0: off (the reference's default).
  float codebook_diversity_loss_weight = 0.f;
  float codebook_diversity_temperature = 100.f;
  // commitment_use_cross_entropy_loss: the commitment term is the cross
  // entropy of each row's code logits against its code (vq/code_logits.h)
  // instead of the squared distance, as the reference (training steps).
  bool commitment_use_cross_entropy_loss = false;
  // The orthogonal regulariser of a learnable codebook (vq/orthogonal_reg.h),
  // weighted into the loss in training steps; 0: off.
  float orthogonal_reg_weight = 0.f;
  bool orthogonal_reg_active_codes_only = false;
  int64_t orthogonal_reg_max_codes = 0;  // 0: every code
  // sync_update_v (learnable codebooks): the output plus v (y - y.detach()),
  // as the reference's code does it (after its straight-through or
  // rotation): values unchanged, the gradient through the output times 1 + v.
  float sync_update_v = 0.f;
  // in_place_codebook_optimizer: SGD at this learning rate on a learnable
  // codebook inside each training forward (vq/in_place_codebook_step.h);
  // 0: off.
  float in_place_codebook_lr = 0.f;
  // The codebooks quantize but never change in training: no EMA update, no
  // revival, no gradient to a learnable codebook (k-means init still runs
  // once, as in the reference). A training step then issues no collective
  // but that init and the losses' means.
  bool freeze_codebook = false;
  // A LayerNorm after project_in (only with a projection, as in the reference).
  bool layernorm_after_project_in = false;
  // Codebook hyper-parameters; codebook_size, dim and seed are set from the
  // fields above (each separate codebook gets its own seed).
  CodebookOptions codebook;
  uint64_t seed = 0;
};

class VectorQuantize : public Quantizer {
 public:
  VectorQuantize(const VectorQuantizeOptions& options, Generator& init_gen);

  // The contract (vq/quantizer.h): indices (N, heads), one column per head,
  // -1 for masked rows; metrics one per codebook; layer_losses the one loss.
  // extras: "codebook_diversity_loss" (unweighted, the mean over the
  // codebooks) when its weight is set, 0 outside a training step.
  // Every rank must call in training (also with N = 0 or all rows masked).
  // mask: undefined, or (N) int64 with 1 = keep, 0 = masked.
  QuantizerOutput quantize(const Tensor& x, Communicator& comm, const Tensor& mask = Tensor()) override;

  // Output (N, dim) for indices (N) or (N, heads); -1 rows give zeros before
  // project_out. No collective, no state change.
  Tensor decode(const Tensor& indices) const override;
  std::vector<int64_t> layer_sizes() const override;
  int64_t dim() const override { return opt_.dim; }

  const VectorQuantizeOptions& options() const { return opt_; }
  const std::vector<std::shared_ptr<Codebook>>& codebooks() const { return codebooks_; }

 private:
  // The loss terms of a training step taken from the codes each codebook
  // call's rows were assigned against: one entry per call, when on.
  struct AssignmentLosses {
    std::vector<Tensor> diversity, cross_entropy, orthogonal;
  };
  // (M, heads * cd) -> quantized (M, heads * cd), indices (M, heads).
  void quantize_heads(const Tensor& z, Communicator& comm, Tensor& q, Tensor& indices,
                      std::vector<CodebookMetrics>& metrics, AssignmentLosses& losses);
  // Codebook::forward of `rows`, plus (in a training step) the losses of
  // AssignmentLosses that are on.
  CodebookOutput codebook_step(Codebook& book, const Tensor& rows, Communicator& comm, AssignmentLosses& losses);
  Tensor codes_of(const Tensor& indices) const;  // (M, heads) -> (M, heads * cd), -1 -> 0

  VectorQuantizeOptions opt_;
  int64_t codebook_dim_;
  Projection projection_;
  std::vector<std::shared_ptr<Codebook>> codebooks_;
};


}  // namespace vqddp
