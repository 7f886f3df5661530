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
// quantized with the codebook as it was at the start of the step; then,
// from a single all-reduce of every layer's statistics, it takes one EMA
// step per layer in layer order (as vector-quantize-pytorch's layers each
// step it: the decay applies once per layer) and revives once. Revival's
// rows go in example-major (row n's layers together), the one order whose
// global row numbers, and so the rows revival samples, do not depend on
// how the batch is split.
#pragma once

#include <memory>
#include <vector>

#include "vq/codebook.h"
#include "vq/codebook_loss_options.h"
#include "vq/quantize_dropout.h"
#include "vq/quantizer.h"

namespace vqddp {

// The training terms are CodebookLossOptions' (vq/codebook_loss_options.h),
// applied per layer as the reference passes them to every layer.
struct ResidualVQOptions : CodebookLossOptions {
  int64_t dim = 0;
  int num_quantizers = 8;
  int64_t codebook_size = 1024;
  std::vector<int64_t> codebook_sizes;  // per layer; empty: codebook_size for every layer
  int64_t codebook_dim = 0;             // 0: dim (no projection)
  bool shared_codebook = false;
  QuantizeDropoutOptions quantize_dropout;
  // quant_grad_frac in [0, 1]: the share of the later layers' gradient that
  // flows back through each layer's output (0: the residual is detached).
  float quant_grad_frac = 0.f;
  // beam_size > 1: the layers' codes come from a per-row beam search
  // (vq/beam_search.h) in training; eval_beam_size (0: beam_size) in
  // inference; beam_score_quantizer_weights: w_l per layer (empty: all 1).
  // The codebooks are updated from the chosen paths. Searching starts once
  // every codebook is initialised (the k-means step runs the greedy path).
  // in_place_codebook_optimizer (vq/in_place_codebook_step.h) on learnable
  // codebooks: each layer's codebook steps inside the forward, then the
  // layer's rows are assigned again; a shared codebook steps once, after
  // the last layer, for the sum of the layers' losses (as the reference).
  float in_place_codebook_lr = 0.f;
  // diveq (the reference's DiVeQ for ResidualVQ): learnable layers whose
  // outputs are their codes, no commitment term, the full gradient through
  // the residual, and in training the output's sum direction-
  // reparameterised (vq/directional_reparam.h); with revival on the layers
  // track usage and revive dead codes.
  bool diveq = false;
  int beam_size = 1;
  int eval_beam_size = 0;
  std::vector<float> beam_score_quantizer_weights;
  CodebookOptions codebook;  // hyper-parameters; size, dim and seed are set per layer
  uint64_t seed = 0;
  bool operator==(const ResidualVQOptions&) const = default;
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
  // The beam search's best path (M, layers) on the host, or undefined
  // when this mode's beam is 1.
  Tensor search_paths(const Tensor& z, int layers) const;
};

}  // namespace vqddp
