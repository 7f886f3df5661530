#include "vq/quantizer_options.h"

#include "engine/count_limits.h"
#include "vq/fsp.h"
#include "vq/latent_quantize.h"
#include "vq/fsq.h"
#include "vq/grouped.h"
#include "vq/lfq.h"
#include "vq/residual_fsq.h"
#include "vq/residual_lfq.h"
#include "vq/residual_vq.h"
#include "vq/residual_sim_vq.h"
#include "vq/sim_vq.h"
#include "vq/vector_quantize.h"

namespace vqddp {

namespace {

bool is_grouped(const std::string& type) { return type.starts_with("grouped_"); }
// The type without "grouped_": a grouped type reads its residual type's keys.
std::string base_type(const std::string& type) {
  return is_grouped(type) ? type.substr(std::string_view("grouped_").size()) : type;
}
bool is_fsq(const std::string& type) { return base_type(type) == "fsq" || base_type(type) == "residual_fsq"; }
// Types whose codebook is implicit in `levels`.
bool has_levels(const std::string& type) { return is_fsq(type) || type == "fsp" || type == "latent_quantize"; }
bool is_lfq(const std::string& type) { return base_type(type) == "lfq" || base_type(type) == "residual_lfq"; }

void read_lfq_options(ConfigSection& s, QuantizerOptions& q) {
  q.entropy_loss_weight = static_cast<float>(s.number("entropy_loss_weight", q.entropy_loss_weight));
  q.commitment_loss_weight = static_cast<float>(s.number("commitment_loss_weight", q.commitment_loss_weight));
  q.diversity_gamma = static_cast<float>(s.number("diversity_gamma", q.diversity_gamma));
  q.inv_temperature = static_cast<float>(s.number("inv_temperature", q.inv_temperature));
  q.codebook_scale = static_cast<float>(s.number("codebook_scale", q.codebook_scale));
  if (!(q.entropy_loss_weight >= 0)) s.fail("entropy_loss_weight", "must not be negative");
  if (!(q.commitment_loss_weight >= 0)) s.fail("commitment_loss_weight", "must not be negative");
  if (!(q.inv_temperature > 0)) s.fail("inv_temperature", "must be positive");
  if (!(q.codebook_scale > 0)) s.fail("codebook_scale", "must be positive");
  if (!lfq_codebook_size_ok(q.codebook_size))
    s.fail("codebook_size", fmt::format("must be a power of two in [2, 65536] for type \"{}\", got {}", q.type,
                                        q.codebook_size));
}

QuantizeDropoutOptions dropout_options(const QuantizerOptions& q, std::optional<uint64_t> dropout_seed) {
  return {q.quantize_dropout, q.quantize_dropout_cutoff_index, q.quantize_dropout_multiple_of, dropout_seed};
}

// The fields VectorQuantize and ResidualVQ options share.
template <class Options>
Options codebook_quantizer_options(const QuantizerOptions& q, int64_t dim, uint64_t seed) {
  Options o;
  o.dim = dim;
  o.codebook_size = q.codebook_size;
  o.codebook_dim = q.codebook_dim;
  static_cast<CodebookLossOptions&>(o) = q;  // the training terms, by their one declaration
  o.codebook = q.codebook;
  o.seed = seed;
  return o;
}

SimVQOptions sim_vq_options(const QuantizerOptions& q, int64_t dim) {
  SimVQOptions o;
  o.dim = dim;
  o.codebook_size = q.codebook_size;
  o.frozen_codebook_dim = q.frozen_codebook_dim;
  o.rotation_trick = q.rotation_trick;
  o.commitment_weight = q.commitment_weight;
  o.input_to_quantize_commit_loss_weight = q.input_to_quantize_commit_loss_weight;
  return o;
}

LFQOptions lfq_options(const QuantizerOptions& q, int64_t dim) {
  LFQOptions o;
  o.dim = dim;
  o.codebook_size = q.codebook_size;
  o.entropy_loss_weight = q.entropy_loss_weight;
  o.commitment_weight = q.commitment_loss_weight;
  o.diversity_gamma = q.diversity_gamma;
  o.inv_temperature = q.inv_temperature;
  o.codebook_scale = q.codebook_scale;
  return o;
}

}  // namespace

const std::vector<std::string>& quantizer_types() {
  static const std::vector<std::string> types{
      "vq",     "residual_vq",         "fsq",                  "residual_fsq",        "lfq",
      "residual_lfq", "sim_vq",        "residual_sim_vq",      "grouped_residual_vq", "grouped_residual_fsq",
      "grouped_residual_lfq", "fsp", "latent_quantize"};
  return types;
}

void read_codebook_options(ConfigSection& s, CodebookOptions& c) {
  c.decay = static_cast<float>(s.number("decay", c.decay));
  c.eps = static_cast<float>(s.number("eps", c.eps));
  c.threshold_ema_dead_code = static_cast<float>(s.number("threshold_ema_dead_code", c.threshold_ema_dead_code));
  c.kmeans_init = s.boolean("kmeans_init", c.kmeans_init);
  c.kmeans_iters = static_cast<int>(s.integer("kmeans_iters", c.kmeans_iters, limits::kmeans_iters));
  c.cosine = s.boolean("use_cosine_sim", c.cosine);
  c.learnable = s.boolean("learnable_codebook", c.learnable);
  c.cluster_size_init_ones =
      s.choice("cluster_size_init", c.cluster_size_init_ones ? "ones" : "zeros", {"ones", "zeros"}) == "ones";
  c.sync_stats = s.boolean("sync_codebook", c.sync_stats);
  c.stochastic_sample = s.boolean("stochastic_sample_codes", c.stochastic_sample);
  c.ema_update = s.boolean("ema_update", c.ema_update);
  c.affine_param = s.boolean("affine_param", c.affine_param);
  // The batch statistics are the global batch's always; the reference's
  // switch is read so its configs load (false there is its per-rank bug).
  (void)s.boolean("sync_affine_param", true);
  c.affine_param_batch_decay = static_cast<float>(s.number("affine_param_batch_decay", c.affine_param_batch_decay));
  c.affine_param_codebook_decay =
      static_cast<float>(s.number("affine_param_codebook_decay", c.affine_param_codebook_decay));
  if (!(c.affine_param_batch_decay >= 0 && c.affine_param_batch_decay <= 1)) s.fail("affine_param_batch_decay", "must be in [0, 1]");
  if (!(c.affine_param_codebook_decay >= 0 && c.affine_param_codebook_decay <= 1))
    s.fail("affine_param_codebook_decay", "must be in [0, 1]");
  if (c.affine_param && c.cosine) s.fail("affine_param", "needs \"use_cosine_sim\": false (as the reference asserts)");
  c.sample_temperature = static_cast<float>(s.number("sample_codebook_temp", c.sample_temperature));
  if (!(c.sample_temperature >= 0)) s.fail("sample_codebook_temp", "must not be negative");
  if (!(c.decay >= 0 && c.decay <= 1)) s.fail("decay", "must be in [0, 1]");
  if (!(c.eps > 0)) s.fail("eps", "must be positive");
  if (!(c.threshold_ema_dead_code >= 0)) s.fail("threshold_ema_dead_code", "must not be negative");
}

// Each type reads only the keys it uses (as model.type does), so a key of
// another type (commitment_weight on lfq, decay on fsq, num_quantizers on
// vq) is an unknown key naming the type and the keys it knows, never a
// setting silently ignored.
void read_quantizer_options(ConfigSection s, QuantizerOptions& q) {
  q.type = s.choice("type", q.type, quantizer_types());
  const std::string base = base_type(q.type);  // a grouped type reads its residual type's keys, and groups
  const bool residual = base.starts_with("residual_");
  const bool codebook = base == "vq" || base == "residual_vq";
  if (!residual) q.num_quantizers = 1;
  if (is_grouped(q.type)) q.groups = static_cast<int>(s.integer("groups", q.groups, limits::heads));
  // FSQ's codebook is implicit: the product of its levels.
  if (!has_levels(q.type)) q.codebook_size = s.integer("codebook_size", q.codebook_size, limits::codebook_size);
  if (residual) q.num_quantizers = static_cast<int>(s.integer("num_quantizers", q.num_quantizers, limits::layers));
  if (codebook) {
    q.codebook_dim = s.integer("codebook_dim", q.codebook_dim, limits::codebook_dim);
    q.commitment_weight = static_cast<float>(s.number("commitment_weight", q.commitment_weight));
    q.rotation_trick = s.boolean("rotation_trick", q.rotation_trick);
    q.straight_through = s.boolean("straight_through", q.straight_through);
    if (q.straight_through && q.rotation_trick)
      s.fail("straight_through", "needs \"rotation_trick\": false (at most one of them, as vector-quantize-pytorch asserts)");
    q.codebook_diversity_loss_weight =
        static_cast<float>(s.number("codebook_diversity_loss_weight", q.codebook_diversity_loss_weight));
    q.codebook_diversity_temperature =
        static_cast<float>(s.number("codebook_diversity_temperature", q.codebook_diversity_temperature));
    if (!(q.codebook_diversity_loss_weight >= 0)) s.fail("codebook_diversity_loss_weight", "must not be negative");
    if (!(q.codebook_diversity_temperature > 0)) s.fail("codebook_diversity_temperature", "must be positive");
    q.freeze_codebook = s.boolean("freeze_codebook", q.freeze_codebook);
    q.commitment_use_cross_entropy_loss =
        s.boolean("commitment_use_cross_entropy_loss", q.commitment_use_cross_entropy_loss);
    read_codebook_options(s, q.codebook);
    q.orthogonal_reg_weight = static_cast<float>(s.number("orthogonal_reg_weight", q.orthogonal_reg_weight));
    q.orthogonal_reg_active_codes_only =
        s.boolean("orthogonal_reg_active_codes_only", q.orthogonal_reg_active_codes_only);
    q.orthogonal_reg_max_codes = s.integer("orthogonal_reg_max_codes", q.orthogonal_reg_max_codes, limits::codebook_dim);
    q.sync_update_v = static_cast<float>(s.number("sync_update_v", q.sync_update_v));
    if (!(q.sync_update_v >= 0 && q.sync_update_v <= 1)) s.fail("sync_update_v", "must be in [0, 1]");
    if (q.sync_update_v > 0 && !q.codebook.learnable)
      s.fail("sync_update_v", "needs \"learnable_codebook\": true (as vector-quantize-pytorch asserts)");
    if (!(q.orthogonal_reg_weight >= 0)) s.fail("orthogonal_reg_weight", "must not be negative");
    if (q.orthogonal_reg_weight > 0 && !q.codebook.learnable)
      s.fail("orthogonal_reg_weight",
             "needs \"learnable_codebook\": true (the reference makes the codebook a parameter but keeps its EMA "
             "update, which overwrites each gradient step at the next forward; here the regulariser trains a "
             "learnable codebook)");
  }
  if (q.type == "vq") {
    q.heads = static_cast<int>(s.integer("heads", q.heads, limits::heads));
    q.separate_codebook_per_head = s.boolean("separate_codebook_per_head", q.separate_codebook_per_head);
    q.layernorm_after_project_in = s.boolean("layernorm_after_project_in", q.layernorm_after_project_in);
    q.directional_reparam = s.boolean("directional_reparam", q.directional_reparam);
    q.directional_reparam_variance =
        static_cast<float>(s.number("directional_reparam_variance", q.directional_reparam_variance));
    if (!(q.directional_reparam_variance >= 0)) s.fail("directional_reparam_variance", "must not be negative");
    if (q.directional_reparam && !q.codebook.learnable)
      s.fail("directional_reparam", "needs \"learnable_codebook\": true (the codes learn through the output)");
    if (q.directional_reparam && q.codebook.cosine)
      s.fail("directional_reparam", "needs a Euclidean codebook (use_cosine_sim false)");
    if (q.directional_reparam && !(q.codebook.threshold_ema_dead_code > 0))
      s.fail("directional_reparam", "needs \"threshold_ema_dead_code\" > 0 (dead codes replaced, as the reference asserts)");
    if (q.directional_reparam && (q.rotation_trick || q.straight_through))
      s.fail("directional_reparam", "needs \"rotation_trick\": false (at most one of them, as the reference asserts)");
  }
  if (q.type == "vq" || base == "residual_vq") {
    ConfigSection inplace = s.section("in_place_codebook_optimizer");
    std::string kind = inplace.choice("type", q.in_place_codebook_lr > 0 ? "sgd" : "none", {"none", "sgd"});
    q.in_place_codebook_lr = kind == "sgd" ? static_cast<float>(inplace.number("lr", q.in_place_codebook_lr)) : 0.f;
    if (kind == "sgd" && !(q.in_place_codebook_lr > 0))
      inplace.fail("lr", "must be positive (the in-place SGD step's learning rate)");
    inplace.finish("for in_place_codebook_optimizer");
    if (q.in_place_codebook_lr > 0 && !q.codebook.learnable)
      s.fail("in_place_codebook_optimizer", "needs \"learnable_codebook\": true (it steps the codebook's parameter)");
  }
  if (base == "residual_vq") {
    q.shared_codebook = s.boolean("shared_codebook", q.shared_codebook);
    q.quant_grad_frac = static_cast<float>(s.number("quant_grad_frac", q.quant_grad_frac));
    if (!(q.quant_grad_frac >= 0 && q.quant_grad_frac <= 1)) s.fail("quant_grad_frac", "must be in [0, 1]");
    q.diveq = s.boolean("diveq", q.diveq);
    if (q.diveq && (!q.codebook.learnable || q.codebook.cosine))
      s.fail("diveq", "needs \"learnable_codebook\": true and a Euclidean codebook (the codes learn through the output)");
    q.beam_size = static_cast<int>(s.integer("beam_size", q.beam_size, limits::beam));
    q.eval_beam_size = static_cast<int>(s.integer("eval_beam_size", q.eval_beam_size, {1, limits::beam.hi}));
    std::vector<double> w(q.beam_score_quantizer_weights.begin(), q.beam_score_quantizer_weights.end());
    w = s.numbers("beam_score_quantizer_weights", w);
    if (!w.empty() && static_cast<int64_t>(w.size()) != q.num_quantizers)
      s.fail("beam_score_quantizer_weights", fmt::format("must hold one weight per quantizer ({}), got {}",
                                                         q.num_quantizers, w.size()));
    q.beam_score_quantizer_weights.assign(w.begin(), w.end());
    if ((q.beam_size > 1 || q.eval_beam_size > 1) && (q.codebook.stochastic_sample || q.codebook.affine_param ||
                                                       q.commitment_use_cross_entropy_loss || q.in_place_codebook_lr > 0))
      s.fail("beam_size", "does not go with stochastic_sample_codes, affine_param, commitment_use_cross_entropy_loss or "
                          "in_place_codebook_optimizer");
  }
  if (residual) {
    q.quantize_dropout = s.boolean("quantize_dropout", q.quantize_dropout);
    q.quantize_dropout_cutoff_index = static_cast<int>(
        s.integer("quantize_dropout_cutoff_index", q.quantize_dropout_cutoff_index, {0, q.num_quantizers - 1}));
    q.quantize_dropout_multiple_of =
        static_cast<int>(s.integer("quantize_dropout_multiple_of", q.quantize_dropout_multiple_of, limits::layers));
  }
  if (has_levels(q.type)) {
    std::vector<int64_t> levels(q.levels.begin(), q.levels.end());
    q.levels.clear();
    for (int64_t l : s.integers("levels", levels, limits::fsq_level)) q.levels.push_back(static_cast<int>(l));
    if (q.levels.empty()) s.fail("levels", "is required for type \"" + q.type + "\"");
  }
  if (q.type == "fsq") {
    q.num_codebooks = static_cast<int>(s.integer("num_codebooks", q.num_codebooks, limits::heads));
    // The reference's: one index column per codebook, which is our only layout.
    if (!s.boolean("keep_num_codebooks_dim", true) && q.num_codebooks > 1)
      s.fail("keep_num_codebooks_dim", "must be true with num_codebooks > 1");
    q.preserve_symmetry = s.boolean("preserve_symmetry", q.preserve_symmetry);
    q.bound_hard_clamp = s.boolean("bound_hard_clamp", q.bound_hard_clamp);
  }
  if (is_lfq(q.type)) read_lfq_options(s, q);
  if (q.type == "latent_quantize") {
    q.num_codebooks = static_cast<int>(s.integer("num_codebooks", q.num_codebooks, limits::heads));
    q.latent_commitment_loss_weight =
        static_cast<float>(s.number("commitment_loss_weight", q.latent_commitment_loss_weight));
    q.quantization_loss_weight = static_cast<float>(s.number("quantization_loss_weight", q.quantization_loss_weight));
    if (!(q.latent_commitment_loss_weight >= 0)) s.fail("commitment_loss_weight", "must not be negative");
    if (!(q.quantization_loss_weight >= 0)) s.fail("quantization_loss_weight", "must not be negative");
  }
  if (q.type == "fsp") {
    q.act_name = s.choice("act_name", q.act_name, fsp_activations());
    q.quantize_rate = static_cast<float>(s.number("quantize_rate", q.quantize_rate));
    if (!(q.quantize_rate >= 0 && q.quantize_rate <= 1)) s.fail("quantize_rate", "must be in [0, 1]");
    q.need_inv_act = s.boolean("need_inv_act", q.need_inv_act);
    q.vector_norm = s.choice("vector_norm", q.vector_norm, fsp_vector_norms());
  }
  if (base == "sim_vq" || base == "residual_sim_vq") {
    q.frozen_codebook_dim = s.integer("frozen_codebook_dim", q.frozen_codebook_dim, limits::codebook_dim);
    q.rotation_trick = s.boolean("rotation_trick", q.rotation_trick);
    q.commitment_weight = static_cast<float>(s.number("commitment_weight", q.commitment_weight));
    q.input_to_quantize_commit_loss_weight = static_cast<float>(
        s.number("input_to_quantize_commit_loss_weight", q.input_to_quantize_commit_loss_weight));
    if (!(q.commitment_weight >= 0)) s.fail("commitment_weight", "must not be negative");
    if (!(q.input_to_quantize_commit_loss_weight >= 0))
      s.fail("input_to_quantize_commit_loss_weight", "must not be negative");
  }
  s.finish("for type \"" + q.type + "\"");
}

namespace {

// One quantizer of a type that is not grouped; `dropout_seed` keys the
// quantize dropout stream when set (vq/quantize_dropout.h).
std::shared_ptr<Quantizer> make_one(const QuantizerOptions& q, int64_t dim, uint64_t seed,
                                    std::optional<uint64_t> dropout_seed, Generator& gen) {
  if (q.type == "vq") {
    VectorQuantizeOptions o = codebook_quantizer_options<VectorQuantizeOptions>(q, dim, seed);
    o.heads = q.heads;
    o.separate_codebook_per_head = q.separate_codebook_per_head;
    o.layernorm_after_project_in = q.layernorm_after_project_in;
    o.in_place_codebook_lr = q.in_place_codebook_lr;
    o.directional_reparam = q.directional_reparam;
    o.directional_reparam_variance = q.directional_reparam_variance;
    return std::make_shared<VectorQuantize>(o, gen);
  }
  if (q.type == "residual_vq") {
    ResidualVQOptions o = codebook_quantizer_options<ResidualVQOptions>(q, dim, seed);
    o.num_quantizers = q.num_quantizers;
    o.shared_codebook = q.shared_codebook;
    o.quant_grad_frac = q.quant_grad_frac;
    o.in_place_codebook_lr = q.in_place_codebook_lr;
    o.diveq = q.diveq;
    o.beam_size = q.beam_size;
    o.eval_beam_size = q.eval_beam_size;
    o.beam_score_quantizer_weights = q.beam_score_quantizer_weights;
    o.quantize_dropout = dropout_options(q, dropout_seed);
    return std::make_shared<ResidualVQ>(o, gen);
  }
  if (q.type == "fsq") {
    FSQOptions o{q.levels, dim, q.num_codebooks};
    o.preserve_symmetry = q.preserve_symmetry;
    o.bound_hard_clamp = q.bound_hard_clamp;
    return std::make_shared<FSQ>(o, gen);
  }
  if (q.type == "latent_quantize")
    return std::make_shared<LatentQuantize>(
        LatentQuantizeOptions{q.levels, dim, q.num_codebooks, q.latent_commitment_loss_weight, q.quantization_loss_weight},
        gen);
  if (q.type == "fsp")
    return std::make_shared<FSP>(FSPOptions{q.levels, dim, q.act_name, q.quantize_rate, q.need_inv_act, q.vector_norm, seed},
                                 gen);
  if (q.type == "residual_fsq") {
    ResidualFSQOptions o;
    o.levels = q.levels;
    o.num_quantizers = q.num_quantizers;
    o.dim = dim;
    o.quantize_dropout = dropout_options(q, dropout_seed);
    o.seed = seed;
    return std::make_shared<ResidualFSQ>(o, gen);
  }
  if (q.type == "lfq") return std::make_shared<LFQ>(lfq_options(q, dim), gen);
  if (q.type == "sim_vq") return std::make_shared<SimVQ>(sim_vq_options(q, dim), gen);
  if (q.type == "residual_sim_vq") {
    ResidualSimVQOptions o;
    o.layer = sim_vq_options(q, dim);
    o.num_quantizers = q.num_quantizers;
    o.quantize_dropout = dropout_options(q, dropout_seed);
    o.seed = seed;
    return std::make_shared<ResidualSimVQ>(o, gen);
  }
  if (q.type == "residual_lfq") {
    ResidualLFQOptions o;
    o.dim = dim;
    o.num_quantizers = q.num_quantizers;
    o.codebook_size = q.codebook_size;
    o.lfq = lfq_options(q, 0);
    o.quantize_dropout = dropout_options(q, dropout_seed);
    o.seed = seed;
    return std::make_shared<ResidualLFQ>(o, gen);
  }
  VQDDP_THROW("make_quantizer: unknown type \"{}\" (known: {})", q.type, fmt::join(quantizer_types(), ", "));
}

}  // namespace

std::shared_ptr<Quantizer> make_quantizer(const QuantizerOptions& q, int64_t dim, uint64_t seed, Generator& gen) {
  if (!is_grouped(q.type)) return make_one(q, dim, seed, std::nullopt, gen);
  VQDDP_CHECK(q.groups >= 1 && dim % q.groups == 0, "make_quantizer: groups {} must divide the input width {}", q.groups,
              dim);
  // Each group: the residual type, its own codebook streams, one dropout
  // stream for all (vq/grouped.h).
  QuantizerOptions inner = q;
  inner.type = base_type(q.type);
  std::vector<std::shared_ptr<Quantizer>> groups;
  for (int g = 0; g < q.groups; ++g) groups.push_back(make_one(inner, dim / q.groups, codebook_seed(seed, g), seed, gen));
  return std::make_shared<GroupedQuantizer>(std::move(groups));
}

}  // namespace vqddp
