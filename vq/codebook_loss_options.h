// The options of a codebook quantizer's training terms that VectorQuantize
// and ResidualVQ share (ResidualVQ applies each per layer, as the
// reference passes them to every layer), and that a config's quantizer
// section sets by the same names: one struct, so a new term is declared,
// defaulted and copied once.
#pragma once

#include <cstdint>

namespace vqddp {

struct CodebookLossOptions {
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
  // The codebooks quantize but never change in training: no EMA update, no
  // revival, no gradient to a learnable codebook (k-means init still runs
  // once, as in the reference). A training step then issues no collective
  // but that init and the losses' means.
  bool freeze_codebook = false;
  bool operator==(const CodebookLossOptions&) const = default;
};

}  // namespace vqddp
