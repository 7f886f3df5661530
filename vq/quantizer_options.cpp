#include "vq/quantizer_options.h"

#include <fmt/format.h>

#include "engine/core/count_limits.h"
#include "vq/quantizer_kind.h"

namespace vqddp {

QuantizerOptions::QuantizerOptions() : QuantizerOptions(of("residual_vq")) {}

QuantizerOptions QuantizerOptions::of(const std::string& type) { return quantizer_kind(type).defaults(); }

const QuantizerKind& QuantizerOptions::kind() const { return quantizer_kind(type_); }

const std::vector<std::string>& quantizer_types() {
  static const std::vector<std::string> types = [] {
    std::vector<std::string> t;
    for (const QuantizerKind* k : quantizer_kinds()) t.push_back(k->type);
    return t;
  }();
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
// vq) is an unknown key naming the type and the keys it knows.
void read_quantizer_options(ConfigSection s, QuantizerOptions& q, int64_t dim) {
  const std::string type = s.choice("type", q.type(), quantizer_types());
  if (type != q.type()) q = QuantizerOptions::of(type);
  q.kind().read(s, q, dim);
  s.finish("for type \"" + q.type() + "\"");
}

QuantizerOptions parse_quantizer_options(const nlohmann::json& j, int64_t dim, const std::string& where) {
  QuantizerOptions q;
  read_quantizer_options(ConfigSection(j, "", where), q, dim);
  return q;
}

std::shared_ptr<Quantizer> make_quantizer(const QuantizerOptions& q, int64_t dim, uint64_t seed, Generator& gen) {
  return q.kind().make(q, QuantizerBuild{dim, seed, std::nullopt, gen});
}

// ---- helpers the kinds share ---------------------------------------------------

bool read_codebook_loss_keys(ConfigSection& s, CodebookLossOptions& l, CodebookOptions& c) {
  l.commitment_weight = static_cast<float>(s.number("commitment_weight", l.commitment_weight));
  l.rotation_trick = s.boolean("rotation_trick", l.rotation_trick);
  const bool straight_through = s.boolean("straight_through", false);
  if (straight_through && l.rotation_trick)
    s.fail("straight_through", "needs \"rotation_trick\": false (at most one of them, as vector-quantize-pytorch asserts)");
  l.codebook_diversity_loss_weight =
      static_cast<float>(s.number("codebook_diversity_loss_weight", l.codebook_diversity_loss_weight));
  l.codebook_diversity_temperature =
      static_cast<float>(s.number("codebook_diversity_temperature", l.codebook_diversity_temperature));
  if (!(l.codebook_diversity_loss_weight >= 0)) s.fail("codebook_diversity_loss_weight", "must not be negative");
  if (!(l.codebook_diversity_temperature > 0)) s.fail("codebook_diversity_temperature", "must be positive");
  l.freeze_codebook = s.boolean("freeze_codebook", l.freeze_codebook);
  l.commitment_use_cross_entropy_loss =
      s.boolean("commitment_use_cross_entropy_loss", l.commitment_use_cross_entropy_loss);
  read_codebook_options(s, c);
  l.orthogonal_reg_weight = static_cast<float>(s.number("orthogonal_reg_weight", l.orthogonal_reg_weight));
  l.orthogonal_reg_active_codes_only = s.boolean("orthogonal_reg_active_codes_only", l.orthogonal_reg_active_codes_only);
  l.orthogonal_reg_max_codes = s.integer("orthogonal_reg_max_codes", l.orthogonal_reg_max_codes, limits::codebook_dim);
  l.sync_update_v = static_cast<float>(s.number("sync_update_v", l.sync_update_v));
  if (!(l.sync_update_v >= 0 && l.sync_update_v <= 1)) s.fail("sync_update_v", "must be in [0, 1]");
  if (l.sync_update_v > 0 && !c.learnable)
    s.fail("sync_update_v", "needs \"learnable_codebook\": true (as vector-quantize-pytorch asserts)");
  if (!(l.orthogonal_reg_weight >= 0)) s.fail("orthogonal_reg_weight", "must not be negative");
  if (l.orthogonal_reg_weight > 0 && !c.learnable)
    s.fail("orthogonal_reg_weight",
           "needs \"learnable_codebook\": true (the reference makes the codebook a parameter but keeps its EMA "
           "update, which overwrites each gradient step at the next forward; here the regulariser trains a "
           "learnable codebook)");
  return straight_through;
}

void read_in_place_optimizer(ConfigSection& s, float& lr, const CodebookOptions& c) {
  ConfigSection inplace = s.section("in_place_codebook_optimizer");
  std::string kind = inplace.choice("type", lr > 0 ? "sgd" : "none", {"none", "sgd"});
  lr = kind == "sgd" ? static_cast<float>(inplace.number("lr", lr)) : 0.f;
  if (kind == "sgd" && !(lr > 0)) inplace.fail("lr", "must be positive (the in-place SGD step's learning rate)");
  inplace.finish("for in_place_codebook_optimizer");
  if (lr > 0 && !c.learnable)
    s.fail("in_place_codebook_optimizer", "needs \"learnable_codebook\": true (it steps the codebook's parameter)");
}

void read_quantize_dropout(ConfigSection& s, QuantizeDropoutOptions& d, int layers) {
  d.enabled = s.boolean("quantize_dropout", d.enabled);
  d.cutoff_index = static_cast<int>(s.integer("quantize_dropout_cutoff_index", d.cutoff_index, {0, layers - 1}));
  d.multiple_of = static_cast<int>(s.integer("quantize_dropout_multiple_of", d.multiple_of, limits::layers));
}

std::string section_type(ConfigSection& s, const std::string& type) { return s.string("type", type); }

void read_levels(ConfigSection& s, std::vector<int>& levels, const std::string& type) {
  std::vector<int64_t> read(levels.begin(), levels.end());
  read = s.integers("levels", read, limits::fsq_level);
  if (read.empty()) s.fail("levels", "is required for type \"" + section_type(s, type) + "\"");
  std::optional<int64_t> n = limits::product(read);
  if (!n || *n > limits::codebook_size.hi)
    s.fail("levels", fmt::format("give an implicit codebook of {} codes (their product), more than the {} "
                                 "codebook_size allows",
                                 n ? fmt::format("{}", *n) : std::string("more than 2^63"), limits::codebook_size.hi));
  levels.assign(read.begin(), read.end());
}

void reference_codebook_defaults(CodebookLossOptions& l, CodebookOptions& c, int64_t dim) {
  c.decay = 0.8f;
  c.kmeans_init = false;
  c.kmeans_iters = 10;
  c.threshold_ema_dead_code = 0.f;
  c.cluster_size_init_ones = true;
  l.commitment_weight = 1.f;
  l.rotation_trick = dim > 1;  // the reference: on unless the feature dimension is 1
}

std::vector<ReferenceSlot> nested_slots(const QuantizerKind& kind, const QuantizerOptions& inner,
                                        const std::string& prefix, const std::string& rest) {
  std::vector<ReferenceSlot> slots =
      kind.reference_slots ? kind.reference_slots(inner, rest) : std::vector<ReferenceSlot>{{rest, rest}};
  for (ReferenceSlot& s : slots) {
    s.ours = prefix + s.ours;
    s.theirs = s.layout == ReferenceSlot::Layout::ours_only ? "vqddp." + s.ours : prefix + s.theirs;
  }
  return slots;
}

std::string codebook_of(const std::string& ours) {
  const size_t dot = ours.rfind('.');
  const std::string owner = dot == std::string::npos ? "" : ours.substr(0, dot);
  return owner.ends_with(".affine") ? owner.substr(0, owner.size() - std::string(".affine").size()) : owner;
}

std::optional<std::vector<ReferenceSlot>> codebook_slots(const std::string& ours,
                                                         const std::vector<std::string>& prefixes, int64_t head,
                                                         int64_t heads) {
  using L = ReferenceSlot::Layout;
  const std::string leaf = ours.substr(ours.rfind('.') + 1);
  const bool affine = ours.ends_with(".affine." + leaf);
  if (!affine && leaf != "embed" && leaf != "embed_avg" && leaf != "cluster_size" && leaf != "initted")
    return std::nullopt;
  std::vector<ReferenceSlot> out;
  for (const std::string& p : prefixes) {
    if (leaf == "initted") {
      out.push_back({ours, p + leaf, L::flag});
    } else if (!affine) {
      out.push_back({ours, p + leaf, heads > 1 ? L::head : L::leading_one, head, heads});
    } else if (leaf == "batch_needs_init") {
      out.push_back({ours, "vqddp." + ours, L::ours_only});  // the reference tells by the statistics' absence
    } else if (leaf == "codebook_needs_init") {  // one flag for the reference's two
      out.push_back({ours, p + "codebook_mean_needs_init", L::flag});
      out.push_back({ours, p + "codebook_variance_needs_init", L::flag});
    } else {
      ReferenceSlot s{ours, p + leaf, L::head_row, head, heads};
      s.optional = leaf == "batch_mean" || leaf == "batch_variance";  // None there until the first forward
      out.push_back(s);
    }
  }
  return out;
}

}  // namespace vqddp
