// Quantizer options as users write them (a config's "quantizer" section, a
// replay file's metadata, an embedding program's code), the one reader of
// those keys, and the factory that makes a Quantizer from them.
//
// Keys follow vector-quantize-pytorch where the concept exists there:
//   type                      vq, residual_vq, fsq, residual_fsq, lfq,
//                             residual_lfq, sim_vq, residual_sim_vq,
//                             grouped_residual_vq,
//                             grouped_residual_fsq, grouped_residual_lfq
//                             (the residual type's keys and `groups`), fsp,
//                             latent_quantize
//   codebook_size, num_quantizers, codebook_dim, shared_codebook,
//   commitment_weight, rotation_trick, codebook_diversity_loss_weight,
//   codebook_diversity_temperature, freeze_codebook (vq, residual_vq),
//   heads, separate_codebook_per_head, layernorm_after_project_in,
//   directional_reparam, directional_reparam_variance (vq),
//   in_place_codebook_optimizer ({"type": "sgd", "lr": x}) (vq, residual_vq), quantize_dropout,
//   quantize_dropout_cutoff_index, quantize_dropout_multiple_of, quant_grad_frac,
//   beam_size, eval_beam_size, beam_score_quantizer_weights, diveq (residual_vq), levels (FSQ)
//   straight_through, commitment_use_cross_entropy_loss, orthogonal_reg_weight,
//   orthogonal_reg_active_codes_only, orthogonal_reg_max_codes, sync_update_v (vq, residual_vq)
//   codebook keys (read_codebook_options): decay, eps,
//     threshold_ema_dead_code, kmeans_init, kmeans_iters, use_cosine_sim,
//     learnable_codebook, cluster_size_init, sync_codebook,
//     stochastic_sample_codes, sample_codebook_temp, ema_update, affine_param,
//     sync_affine_param, affine_param_batch_decay, affine_param_codebook_decay
//   LFQ keys (lfq, residual_lfq only): entropy_loss_weight,
//     commitment_loss_weight, diversity_gamma, inv_temperature, codebook_scale
//   FSQ keys (fsq): num_codebooks, keep_num_codebooks_dim, preserve_symmetry,
//     bound_hard_clamp
//   LatentQuantize keys (latent_quantize): levels, num_codebooks,
//     commitment_loss_weight, quantization_loss_weight
//   FSP keys (fsp): levels, act_name, quantize_rate, need_inv_act, vector_norm
//   SimVQ keys (sim_vq, residual_sim_vq): codebook_size, frozen_codebook_dim, rotation_trick,
//     commitment_weight, input_to_quantize_commit_loss_weight
// A bad value is refused by the reader, naming the key path and what is
// allowed, before anything is built or read.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/config_reader.h"
#include "engine/random.h"
#include "vq/codebook.h"
#include "vq/codebook_loss_options.h"
#include "vq/quantizer.h"

namespace vqddp {

// The codebook quantizers' training terms are CodebookLossOptions'
// (commitment_weight and rotation_trick also SimVQ's).
struct QuantizerOptions : CodebookLossOptions {
  std::string type = "residual_vq";  // one of quantizer_types()
  int64_t codebook_size = 256;
  int num_quantizers = 4;
  int64_t codebook_dim = 0;  // 0: the input width (vq: the width / heads), no projection
  bool shared_codebook = false;
  // vq, residual_vq: the reference's Gumbel straight-through. Its softmax
  // gradient is cut by the reference's own outer straight-through estimator
  // whenever the input needs a gradient, so it changes neither outputs nor
  // gradients there; accepted (with its rule: not with rotation_trick) and
  // the same here.
  bool straight_through = false;
  int groups = 1;                        // grouped_*: feature groups, each its own residual quantizer
  int heads = 1;                         // vq
  float quant_grad_frac = 0.f;                      // residual_vq, in [0, 1]
  bool directional_reparam = false;                 // vq (vq/directional_reparam.h)
  float directional_reparam_variance = 5e-3f;       // vq
  bool diveq = false;                               // residual_vq (vq/residual_vq.h)
  int beam_size = 1;                                // residual_vq (vq/beam_search.h)
  int eval_beam_size = 0;                           // residual_vq; 0: beam_size
  std::vector<float> beam_score_quantizer_weights;  // residual_vq; empty: all 1
  // vq, residual_vq with a learnable codebook: in_place_codebook_optimizer {"type": "sgd",
  // "lr": x}; 0: off.
  float in_place_codebook_lr = 0.f;
  bool layernorm_after_project_in = false;       // vq
  bool separate_codebook_per_head = false;  // vq
  CodebookOptions codebook;  // decay, eps, threshold, kmeans, cosine, learnable, cluster_size_init, sync
  bool quantize_dropout = false;
  int quantize_dropout_cutoff_index = 0;
  int quantize_dropout_multiple_of = 1;
  std::vector<int> levels;  // FSQ
  bool preserve_symmetry = false;  // fsq (vq/fsq.h)
  bool bound_hard_clamp = false;   // fsq
  // LFQ (vector-quantize-pytorch's LFQ defaults but commitment_loss_weight:
  // 0 there, 0.25 here as in MAGVIT-v2; `replay` takes the reference's).
  float entropy_loss_weight = 0.1f;
  float commitment_loss_weight = 0.25f;
  float diversity_gamma = 1.f;
  float inv_temperature = 100.f;
  float codebook_scale = 1.f;
  // SimVQ (vector-quantize-pytorch's SimVQ defaults).
  int64_t frozen_codebook_dim = 0;  // 0: the input width
  float input_to_quantize_commit_loss_weight = 0.25f;
  // LatentQuantize (vector-quantize-pytorch's defaults; its key
  // commitment_loss_weight has another default there than LFQ's).
  int num_codebooks = 1;
  float latent_commitment_loss_weight = 0.1f;
  float quantization_loss_weight = 0.1f;
  // FSP (vector-quantize-pytorch's FSP defaults).
  std::string act_name = "tanh";
  float quantize_rate = 0.f;
  bool need_inv_act = false;
  std::string vector_norm = "var_tanh";
  bool operator==(const QuantizerOptions&) const = default;
};

const std::vector<std::string>& quantizer_types();

// The codebook keys (listed above) into `c`, with their checks. Reads only
// those keys: the caller finishes the section.
void read_codebook_options(ConfigSection& s, CodebookOptions& c);

// A whole quantizer section into `q` (starting from q's values), checked;
// finishes the section (unknown keys are errors).
void read_quantizer_options(ConfigSection s, QuantizerOptions& q);

// The Quantizer `q` describes, for inputs of width `dim`. `seed` keys its
// shared random streams (codebook init, k-means, revival, dropout); its
// initial weights (projections, codebooks) are drawn from `init_gen`.
std::shared_ptr<Quantizer> make_quantizer(const QuantizerOptions& q, int64_t dim, uint64_t seed, Generator& init_gen);

}  // namespace vqddp
