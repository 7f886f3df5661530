#include "vq/quantizer_options.h"

#include "engine/count_limits.h"
#include "vq/fsq.h"
#include "vq/lfq.h"
#include "vq/residual_fsq.h"
#include "vq/residual_lfq.h"
#include "vq/residual_vq.h"
#include "vq/vector_quantize.h"

namespace vqddp {

namespace {

bool is_fsq(const std::string& type) { return type == "fsq" || type == "residual_fsq"; }
bool is_lfq(const std::string& type) { return type == "lfq" || type == "residual_lfq"; }

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

QuantizeDropoutOptions dropout_options(const QuantizerOptions& q) {
  return {q.quantize_dropout, q.quantize_dropout_cutoff_index, q.quantize_dropout_multiple_of};
}

// The fields VectorQuantize and ResidualVQ options share.
template <class Options>
Options codebook_quantizer_options(const QuantizerOptions& q, int64_t dim, uint64_t seed) {
  Options o;
  o.dim = dim;
  o.codebook_size = q.codebook_size;
  o.codebook_dim = q.codebook_dim;
  o.commitment_weight = q.commitment_weight;
  o.codebook = q.codebook;
  o.seed = seed;
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
  static const std::vector<std::string> types{"vq", "residual_vq", "fsq", "residual_fsq", "lfq", "residual_lfq"};
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
  const bool residual = q.type.starts_with("residual_");
  const bool codebook = q.type == "vq" || q.type == "residual_vq";
  if (!residual) q.num_quantizers = 1;
  // FSQ's codebook is implicit: the product of its levels.
  if (!is_fsq(q.type)) q.codebook_size = s.integer("codebook_size", q.codebook_size, limits::codebook_size);
  if (residual) q.num_quantizers = static_cast<int>(s.integer("num_quantizers", q.num_quantizers, limits::layers));
  if (codebook) {
    q.codebook_dim = s.integer("codebook_dim", q.codebook_dim, limits::codebook_dim);
    q.commitment_weight = static_cast<float>(s.number("commitment_weight", q.commitment_weight));
    read_codebook_options(s, q.codebook);
  }
  if (q.type == "residual_vq") q.shared_codebook = s.boolean("shared_codebook", q.shared_codebook);
  if (residual) {
    q.quantize_dropout = s.boolean("quantize_dropout", q.quantize_dropout);
    q.quantize_dropout_cutoff_index = static_cast<int>(
        s.integer("quantize_dropout_cutoff_index", q.quantize_dropout_cutoff_index, {0, q.num_quantizers - 1}));
    q.quantize_dropout_multiple_of =
        static_cast<int>(s.integer("quantize_dropout_multiple_of", q.quantize_dropout_multiple_of, limits::layers));
  }
  if (is_fsq(q.type)) {
    std::vector<int64_t> levels(q.levels.begin(), q.levels.end());
    q.levels.clear();
    for (int64_t l : s.integers("levels", levels, limits::fsq_level)) q.levels.push_back(static_cast<int>(l));
    if (q.levels.empty()) s.fail("levels", "is required for type \"" + q.type + "\"");
  }
  if (is_lfq(q.type)) read_lfq_options(s, q);
  s.finish("for type \"" + q.type + "\"");
}

std::shared_ptr<Quantizer> make_quantizer(const QuantizerOptions& q, int64_t dim, uint64_t seed, Generator& gen) {
  if (q.type == "vq") return std::make_shared<VectorQuantize>(codebook_quantizer_options<VectorQuantizeOptions>(q, dim, seed), gen);
  if (q.type == "residual_vq") {
    ResidualVQOptions o = codebook_quantizer_options<ResidualVQOptions>(q, dim, seed);
    o.num_quantizers = q.num_quantizers;
    o.shared_codebook = q.shared_codebook;
    o.quantize_dropout = dropout_options(q);
    return std::make_shared<ResidualVQ>(o, gen);
  }
  if (q.type == "fsq") return std::make_shared<FSQ>(FSQOptions{q.levels, dim, 1}, gen);
  if (q.type == "residual_fsq") {
    ResidualFSQOptions o;
    o.levels = q.levels;
    o.num_quantizers = q.num_quantizers;
    o.dim = dim;
    o.quantize_dropout = dropout_options(q);
    o.seed = seed;
    return std::make_shared<ResidualFSQ>(o, gen);
  }
  if (q.type == "lfq") return std::make_shared<LFQ>(lfq_options(q, dim), gen);
  if (q.type == "residual_lfq") {
    ResidualLFQOptions o;
    o.dim = dim;
    o.num_quantizers = q.num_quantizers;
    o.codebook_size = q.codebook_size;
    o.lfq = lfq_options(q, 0);
    o.quantize_dropout = dropout_options(q);
    o.seed = seed;
    return std::make_shared<ResidualLFQ>(o, gen);
  }
  VQDDP_THROW("make_quantizer: unknown type \"{}\" (known: {})", q.type, fmt::join(quantizer_types(), ", "));
}

}  // namespace vqddp
