#include "vq/vector_quantize.h"

#include <fmt/format.h>

#include "engine/core/count_limits.h"
#include "engine/ops.h"
#include "vq/codebook_layer.h"
#include "vq/directional_reparam.h"
#include "vq/index_columns.h"
#include "vq/losses.h"
#include "vq/masked_rows.h"
#include "vq/quantizer_kind.h"
#include "vq/rotation_trick.h"

namespace vqddp {

VectorQuantize::VectorQuantize(const VectorQuantizeOptions& o, Generator& init_gen) : opt_(o) {
  VQDDP_CHECK(o.dim > 0 && o.heads >= 1, "VectorQuantize: dim {} and heads {} must be positive", o.dim, o.heads);
  codebook_dim_ = o.codebook_dim > 0 ? o.codebook_dim : o.dim / o.heads;
  VQDDP_CHECK(codebook_dim_ > 0 && (o.codebook_dim > 0 || o.dim % o.heads == 0),
              "VectorQuantize: dim {} is not divisible by heads {}; set codebook_dim", o.dim, o.heads);
  int64_t inner = codebook_dim_ * o.heads;
  projection_ = make_projection(o.dim, inner, init_gen, o.layernorm_after_project_in);
  VQDDP_CHECK(!o.directional_reparam || (o.codebook.learnable && !o.codebook.cosine &&
                                           o.codebook.threshold_ema_dead_code > 0 && !o.rotation_trick),
              "VectorQuantize: directional_reparam needs a learnable Euclidean codebook with "
              "threshold_ema_dead_code > 0 and the rotation trick off");
  int books = o.separate_codebook_per_head ? o.heads : 1;
  for (int h = 0; h < books; ++h) {
    CodebookOptions c = o.codebook;
    c.track_usage = o.directional_reparam;
    c.codebook_size = o.codebook_size;
    c.dim = codebook_dim_;
    c.seed = codebook_seed(o.seed, h);
    codebooks_.push_back(register_module(books == 1 ? "codebook" : "codebook" + std::to_string(h),
                                         std::make_shared<Codebook>(c, init_gen)));
  }
}

CodebookOutput VectorQuantize::codebook_step(Codebook& book, const Tensor& rows, Communicator& comm,
                                             AssignmentLosses& losses) {
  std::optional<CodebookLayerStep> step =
      codebook_layer_step(book, rows, comm, {opt_, opt_.in_place_codebook_lr, updates_state(), false});
  if (!step) return {zeros({0, codebook_dim_}, DType::f32, rows.device()), zeros({0}, DType::i64, rows.device()),
                     CodebookMetrics::empty_world()};  // nobody had rows, on every rank
  if (step->diversity.defined()) losses.diversity.push_back(step->diversity);
  if (step->orthogonal.defined()) losses.orthogonal.push_back(step->orthogonal);
  if (step->cross_entropy.defined()) losses.cross_entropy.push_back(step->cross_entropy);
  return {step->assignment.codes, step->assignment.indices, step->metrics};
}

void VectorQuantize::quantize_heads(const Tensor& z, Communicator& comm, Tensor& q, Tensor& indices,
                                    std::vector<CodebookMetrics>& metrics, AssignmentLosses& losses) {
  int64_t m = z.size(0), h = opt_.heads, cd = codebook_dim_;
  if (codebooks_.size() == 1) {
    // Head h of row n is row n*h + h: one codebook sees every head's rows.
    CodebookOutput out = codebook_step(*codebooks_[0], reshape(z, {m * h, cd}), comm, losses);
    q = reshape(out.quantize, {m, h * cd});
    indices = reshape(out.indices, {m, h});
    metrics.push_back(out.metrics);
    return;
  }
  Tensor by_head = reshape(transpose(reshape(z, {m, h, cd}), 0, 1), {h * m, cd});  // (H*M, cd), head-major
  std::vector<Tensor> qs, is;
  for (int64_t i = 0; i < h; ++i) {
    CodebookOutput out = codebook_step(*codebooks_[i], slice_rows(by_head, i * m, (i + 1) * m), comm, losses);
    qs.push_back(out.quantize);
    is.push_back(out.indices);
    metrics.push_back(out.metrics);
  }
  q = reshape(transpose(reshape(concat(qs, 0), {h, m, cd}), 0, 1), {m, h * cd});
  indices = stack_columns(is);  // (M, H)
}

QuantizerOutput VectorQuantize::quantize(const Tensor& x, Communicator& comm, const Tensor& mask) {
  VQDDP_CHECK(x.defined() && x.dim() == 2 && x.size(1) == opt_.dim, "rank {}: VectorQuantize expects [N, {}], got {}",
              comm.rank(), opt_.dim, x.desc());
  MaskedRows rows(mask, x.size(0), comm.rank());
  Tensor z = rows.compact(x);                 // (M, dim)
  z = projection_.in(z);  // (M, heads * cd)
  if (codebooks_[0]->options().cosine) {
    // As the reference: each head piece is normalised before everything,
    // so the commitment loss and the output's gradient see the unit vector
    // the codebook compares (the codebook's own normalisation is then a
    // no-op up to rounding).
    const int64_t m = z.size(0), h = opt_.heads;
    z = reshape(l2_normalize_rows(reshape(z, {m * h, codebook_dim_})), {m, h * codebook_dim_});
  }
  QuantizerOutput out;
  Tensor q, idx;
  AssignmentLosses losses;
  quantize_heads(z, comm, q, idx, out.metrics, losses);
  // A frozen learnable codebook gets no gradient: its codes count as constants.
  const bool learnable = codebooks_[0]->options().learnable && !opt_.freeze_codebook;
  if (!losses.cross_entropy.empty()) {
    // The mean over codebook calls of their row means: every call has the
    // same rows (one per head piece), so this is the mean over rows and heads.
    const std::vector<Tensor>& ce = losses.cross_entropy;
    Tensor total = ce[0];
    for (size_t i = 1; i < ce.size(); ++i) total = add(total, ce[i]);
    out.loss = mul(div(total, static_cast<float>(ce.size())), opt_.commitment_weight);
  } else if (opt_.directional_reparam) {
    // The reference: no commitment loss; the codes learn through the output.
    out.loss = full({}, 0.0, DType::f32, x.device());
  } else {
    out.loss = quantization_loss(learnable ? q : q.detach(), z, opt_.commitment_weight, learnable, comm);
  }
  // Each further term: the mean over codebooks (the reference's sum over
  // heads over h), logged as an extra and added with its weight.
  auto add_term = [&](const char* name, const std::vector<Tensor>& terms, float weight) {
    Tensor t = full({}, 0.0, DType::f32, x.device());
    for (const Tensor& each : terms) t = add(t, each);
    if (!terms.empty()) t = div(t, static_cast<float>(terms.size()));
    out.extras[name] = t;
    out.loss = add(out.loss, mul(t, weight));
  };
  if (opt_.orthogonal_reg_weight > 0) add_term("orthogonal_reg_loss", losses.orthogonal, opt_.orthogonal_reg_weight);
  if (opt_.codebook_diversity_loss_weight > 0)
    add_term("codebook_diversity_loss", losses.diversity, opt_.codebook_diversity_loss_weight);
  // Per head: each head's piece of a row is rotated onto its own code
  // (vector-quantize-pytorch rotates the head-split rows).
  const int64_t m = z.size(0), h = opt_.heads;
  Tensor y;
  if (opt_.directional_reparam && updates_state()) {
    // Each head piece of global row g is row g h + i of the noise's rows.
    y = reshape(directional_reparam(reshape(z, {m * h, codebook_dim_}), reshape(q, {m * h, codebook_dim_}),
                                    opt_.directional_reparam_variance, first_global_row(comm, m) * h,
                                    codebooks_[0]->draw_stream()),
                {m, h * codebook_dim_});
  } else {
    y = reshape(through_quantizer(reshape(z, {m * h, codebook_dim_}), reshape(q, {m * h, codebook_dim_}),
                                  opt_.rotation_trick && is_training()),
                {m, h * codebook_dim_});
  }
  if (opt_.sync_update_v > 0 && is_training()) y = add(y, mul(sub(y, y.detach()), opt_.sync_update_v));
  y = projection_.out(y);  // (M, dim)
  out.quantized = rows.expand(y, x);
  out.indices = rows.expand_indices(idx);  // (N, heads)
  out.layer_losses = {out.loss};
  out.active_layers = opt_.heads;
  return out;
}

Tensor VectorQuantize::codes_of(const Tensor& indices) const {
  int64_t m = indices.size(0), h = opt_.heads, cd = codebook_dim_;
  std::vector<Tensor> heads = split_columns(indices), codes;
  for (int64_t j = 0; j < h; ++j) {
    const Codebook& book = *codebooks_[codebooks_.size() == 1 ? 0 : j];
    // Codebook::lookup: the codes exactly as the forward used them.
    codes.push_back(codes_or_zero(heads[j], cd, [&](const Tensor& i) { return book.lookup(i.to(book.embed.device())); }));
  }
  return reshape(transpose(reshape(concat(codes, 0), {h, m, cd}), 0, 1), {m, h * cd});  // head-major -> (M, H*cd)
}

Tensor VectorQuantize::decode(const Tensor& indices) const {
  VQDDP_CHECK(indices.dtype() == DType::i64 && indices.numel() % opt_.heads == 0 &&
                  (indices.dim() == 1 ? opt_.heads == 1 : indices.dim() == 2 && indices.size(1) == opt_.heads),
              "decode: expected int64 indices [N] or [N, {}], got {}", opt_.heads, indices.desc());
  Tensor codes = codes_of(indices.reshape({-1, opt_.heads}));
  return projection_.out(codes);
}

std::vector<int64_t> VectorQuantize::layer_sizes() const { return std::vector<int64_t>(opt_.heads, opt_.codebook_size); }

// ---- the "vq" kind (vq/quantizer_kind.h) -----------------------------------------

namespace {

void read_vq(ConfigSection& s, VectorQuantizeOptions& o, int64_t dim) {
  o.codebook_size = s.integer("codebook_size", o.codebook_size, limits::codebook_size);
  o.codebook_dim = s.integer("codebook_dim", o.codebook_dim, limits::codebook_dim);
  const bool straight_through = read_codebook_loss_keys(s, o, o.codebook);
  o.heads = static_cast<int>(s.integer("heads", o.heads, limits::heads));
  o.separate_codebook_per_head = s.boolean("separate_codebook_per_head", o.separate_codebook_per_head);
  o.layernorm_after_project_in = s.boolean("layernorm_after_project_in", o.layernorm_after_project_in);
  o.directional_reparam = s.boolean("directional_reparam", o.directional_reparam);
  o.directional_reparam_variance =
      static_cast<float>(s.number("directional_reparam_variance", o.directional_reparam_variance));
  if (!(o.directional_reparam_variance >= 0)) s.fail("directional_reparam_variance", "must not be negative");
  if (o.directional_reparam && !o.codebook.learnable)
    s.fail("directional_reparam", "needs \"learnable_codebook\": true (the codes learn through the output)");
  if (o.directional_reparam && o.codebook.cosine)
    s.fail("directional_reparam", "needs a Euclidean codebook (use_cosine_sim false)");
  if (o.directional_reparam && !(o.codebook.threshold_ema_dead_code > 0))
    s.fail("directional_reparam", "needs \"threshold_ema_dead_code\" > 0 (dead codes replaced, as the reference asserts)");
  if (o.directional_reparam && (o.rotation_trick || straight_through))
    s.fail("directional_reparam", "needs \"rotation_trick\": false (at most one of them, as the reference asserts)");
  read_in_place_optimizer(s, o.in_place_codebook_lr, o.codebook);
  if (dim > 0) {
    if (o.codebook_dim == 0 && dim % o.heads != 0)
      s.fail("heads", fmt::format("must divide the input width ({}; model.latent_dim in a config) unless codebook_dim is "
                                  "set, got {}", dim, o.heads));
    // Each codebook: codebook_dim wide (0: the width / heads), one per head when separate.
    s.check_elements("codebook_size", "codebook_size x codebook_dim x codebooks",
                     {o.codebook_size, o.codebook_dim > 0 ? o.codebook_dim : dim / o.heads,
                      o.separate_codebook_per_head ? o.heads : 1});
  }
}

}  // namespace

const QuantizerKind& vector_quantize_kind() {
  static const QuantizerKind kind = [] {
    VectorQuantizeOptions defaults;
    defaults.codebook_size = 256;
    QuantizerKind k = make_kind<VectorQuantize, VectorQuantizeOptions>("vq", defaults, read_vq);
    k.test_keys = {{"codebook_size", 16}, {"kmeans_init", true}, {"kmeans_iters", 3}, {"threshold_ema_dead_code", 1.5}};
    k.reference_class = "VectorQuantize";
    k.reference_defaults = [](QuantizerOptions& q, int64_t dim) {
      auto& o = q.as<VectorQuantizeOptions>();
      reference_codebook_defaults(o, o.codebook, dim);
      o.codebook_dim = dim;  // there each head is codebook_dim wide, dim by default; ours: dim / heads
    };
    k.reference_slots = [](const QuantizerOptions& q, const std::string& ours) {
      const std::string book = codebook_of(ours), leaf = ours.substr(ours.rfind('.') + 1);
      // layernorm_after_project_in: there project_in is Sequential(Linear, LayerNorm).
      if (book == "project_in_norm") return std::vector<ReferenceSlot>{{ours, "project_in.1." + leaf}};
      if (book == "project_in" && q.as<VectorQuantizeOptions>().layernorm_after_project_in)
        return std::vector<ReferenceSlot>{{ours, "project_in.0." + leaf}};
      std::optional<std::vector<ReferenceSlot>> slots;
      if (book == "codebook")
        slots = codebook_slots(ours, {"_codebook."});
      else if (book.starts_with("codebook"))  // codebook<h>: separate codebooks, stacked there
        slots = codebook_slots(ours, {"_codebook."}, std::stoll(book.substr(std::string("codebook").size())),
                               q.as<VectorQuantizeOptions>().heads);
      return slots ? *slots : std::vector<ReferenceSlot>{{ours, ours}};
    };
    return k;
  }();
  return kind;
}

}  // namespace vqddp
