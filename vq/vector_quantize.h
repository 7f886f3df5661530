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
#include "vq/codebook_loss_options.h"
#include "vq/quantizer.h"

namespace vqddp {

// The training terms (commitment, rotation trick, diversity, ...) are
// CodebookLossOptions' (vq/codebook_loss_options.h).
struct VectorQuantizeOptions : CodebookLossOptions {
  int64_t dim = 0;
  int64_t codebook_size = 512;
  int64_t codebook_dim = 0;  // 0: dim / heads
  int heads = 1;
  bool separate_codebook_per_head = false;
  // in_place_codebook_optimizer: SGD at this learning rate on a learnable
  // codebook inside each training forward (vq/in_place_codebook_step.h);
  // 0: off.
  float in_place_codebook_lr = 0.f;
  // A LayerNorm after project_in (only with a projection, as in the reference).
  bool layernorm_after_project_in = false;
  // DiVeQ (vq/directional_reparam.h): in training the output is the
  // direction-reparameterised code instead of the rotation trick or
  // straight-through, with no commitment term; needs a learnable Euclidean
  // codebook with revival on (it then tracks usage), the rotation trick off.
  bool directional_reparam = false;
  float directional_reparam_variance = 5e-3f;
  // Codebook hyper-parameters; codebook_size, dim and seed are set from the
  // fields above (each separate codebook gets its own seed).
  CodebookOptions codebook;
  uint64_t seed = 0;
  bool operator==(const VectorQuantizeOptions&) const = default;
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
