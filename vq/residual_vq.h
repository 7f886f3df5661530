// ResidualVQ: Q codebooks applied in turn to what the previous ones left.
//
//   z = project_in(x); residual = z
//   for layer l <= last active:  q_l = quantize_l(residual) (straight-through)
//                                residual -= q_l.detach();  out += q_l
//   output = project_out(out); indices (N, Q), -1 for dropped layers
// Each layer's loss is commitment_weight * mse(q_l.detach(), residual_l)
// (plus the codebook loss for learnable codebooks); the total is their sum.
// Quantize dropout: vq/quantize_dropout.h; it starts once every codebook is
// initialised, so the first training step runs (and k-means-initialises)
// every layer.
//
// With shared_codebook, ONE codebook serves every layer: all layers are
// quantized with the codebook as it was at the start of the step, and the
// codebook is updated once, with every layer's residuals and indices, in a
// single all-reduce. Those rows go in example-major (row n's layers
// together), the one order whose global row numbers, and so the rows
// revival samples, do not depend on how the batch is split.
#pragma once

#include <memory>
#include <vector>

#include "vq/codebook.h"
#include "vq/quantize_dropout.h"
#include "vq/quantizer.h"

namespace vqddp {

struct ResidualVQOptions {
  int64_t dim = 0;
  int num_quantizers = 8;
  int64_t codebook_size = 1024;
  std::vector<int64_t> codebook_sizes;  // per layer; empty: codebook_size for every layer
  int64_t codebook_dim = 0;             // 0: dim (no projection)
  bool shared_codebook = false;
  QuantizeDropoutOptions quantize_dropout;
  float commitment_weight = 1.f;
  bool rotation_trick = true;  // per layer, as VectorQuantizeOptions
  // Per layer, as VectorQuantizeOptions (the reference passes them to every
  // layer): the diversity loss (each layer's, weighted, in its layer loss)
  // and frozen codebooks.
  float codebook_diversity_loss_weight = 0.f;
  float codebook_diversity_temperature = 100.f;
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
  // quant_grad_frac in [0, 1]: the share of the later layers' gradient that
  // flows back through each layer's output (0: the residual is detached).
  float quant_grad_frac = 0.f;  // per layer, as VectorQuantizeOptions
  bool freeze_codebook = false;
  CodebookOptions codebook;  // hyper-parameters; size, dim and seed are set per layer
  uint64_t seed = 0;
};

class ResidualVQ : public Quantizer {
 public:
  ResidualVQ(const ResidualVQOptions& options, Generator& init_gen);

  // The contract (vq/quantizer.h): indices (N, Q) int64, -1 for dropped
  // layers and masked rows; loss the sum of Q layer_losses (0 for dropped
  // layers); metrics one entry per layer (separate codebooks; a layer that
  // quantize dropout skipped has the metrics of an empty batch, what its
  // indices, all -1, would count) or one for a shared codebook. extras:
  // "codebook_diversity_loss", the layers' sum (unweighted), when its
  // weight is set.
  // Every rank must call in training. mask: undefined or int64 (N), 1 = keep.
  QuantizerOutput quantize(const Tensor& x, Communicator& comm, const Tensor& mask = Tensor()) override;

  // Per layer (N, codebook_dim) codes for indices (N, Q); -1 gives zeros.
  std::vector<Tensor> get_codes_from_indices(const Tensor& indices) const;
  // project_out(sum of the layers' codes): the forward output in eval.
  Tensor decode(const Tensor& indices) const override;
  std::vector<int64_t> layer_sizes() const override;
  int64_t dim() const override { return opt_.dim; }

  const ResidualVQOptions& options() const { return opt_; }
  const Codebook& codebook(int layer) const { return *books_[opt_.shared_codebook ? 0 : layer]; }

 private:
  ResidualVQOptions opt_;
  int64_t codebook_dim_;
  Projection projection_;
  std::vector<std::shared_ptr<Codebook>> books_;
  Tensor dropout_step_;  // int64 (1): training steps drawn so far (the dropout stream)
};

}  // namespace vqddp
