#include "vq/residual_vq.h"

#include <algorithm>

#include <fmt/format.h>

#include "engine/core/count_limits.h"
#include "engine/ops.h"
#include "vq/masked_rows.h"
#include "vq/beam_search.h"
#include "vq/codebook_layer.h"
#include "vq/directional_reparam.h"
#include "vq/in_place_codebook_step.h"
#include "vq/index_columns.h"
#include "vq/losses.h"
#include "vq/quantizer_kind.h"
#include "vq/rotation_trick.h"

namespace vqddp {

ResidualVQ::ResidualVQ(const ResidualVQOptions& o, Generator& init_gen) : opt_(o) {
  VQDDP_CHECK(o.dim > 0 && o.num_quantizers >= 1, "ResidualVQ: dim {} and num_quantizers {} must be positive", o.dim,
              o.num_quantizers);
  VQDDP_CHECK(o.codebook_sizes.empty() || static_cast<int>(o.codebook_sizes.size()) == o.num_quantizers,
              "ResidualVQ: {} codebook_sizes for {} quantizers", o.codebook_sizes.size(), o.num_quantizers);
  VQDDP_CHECK(!o.shared_codebook || o.codebook_sizes.empty(), "ResidualVQ: a shared codebook has one size");
  codebook_dim_ = o.codebook_dim > 0 ? o.codebook_dim : o.dim;
  projection_ = make_projection(o.dim, codebook_dim_, init_gen);
  int books = o.shared_codebook ? 1 : o.num_quantizers;
  for (int l = 0; l < books; ++l) {
    CodebookOptions c = o.codebook;
    c.track_usage = o.diveq && c.threshold_ema_dead_code > 0;  // revival, as the reference's learnable layers
    c.codebook_size = o.codebook_sizes.empty() ? o.codebook_size : o.codebook_sizes[l];
    c.dim = codebook_dim_;
    c.seed = codebook_seed(o.seed, l);
    books_.push_back(register_module(o.shared_codebook ? "codebook" : "layer" + std::to_string(l),
                                     std::make_shared<Codebook>(c, init_gen)));
  }
  // Offsets the dropout stream id (engine/core/streams.h): never negative.
  dropout_step_ = register_buffer("dropout_step", zeros({1}, DType::i64), ValueRange::non_negative());
  VQDDP_CHECK(o.in_place_codebook_lr == 0 || o.codebook.learnable,
              "ResidualVQ: in_place_codebook_optimizer needs a learnable codebook");
  VQDDP_CHECK(o.beam_size >= 1 && o.eval_beam_size >= 0, "ResidualVQ: beam_size {} and eval_beam_size {} must be positive",
              o.beam_size, o.eval_beam_size);
  VQDDP_CHECK(o.beam_score_quantizer_weights.empty() ||
                  static_cast<int>(o.beam_score_quantizer_weights.size()) == o.num_quantizers,
              "ResidualVQ: {} beam_score_quantizer_weights for {} quantizers", o.beam_score_quantizer_weights.size(),
              o.num_quantizers);
  VQDDP_CHECK(!o.diveq || (o.codebook.learnable && !o.codebook.cosine),
              "ResidualVQ: diveq needs learnable Euclidean codebooks");
  if (o.beam_size > 1 || o.eval_beam_size > 1) {
    // The search scores squared distances to the codes as the codebook
    // holds them: no draw, no affine transform, no cross-entropy term.
    VQDDP_CHECK(!o.codebook.stochastic_sample && !o.codebook.affine_param && !o.commitment_use_cross_entropy_loss &&
                    o.in_place_codebook_lr == 0,
                "ResidualVQ: beam search does not go with stochastic_sample_codes, affine_param, "
                "commitment_use_cross_entropy_loss or in_place_codebook_optimizer");
  }
}

Tensor ResidualVQ::search_paths(const Tensor& z, int layers) const {
  const int beam = is_training() ? opt_.beam_size : (opt_.eval_beam_size > 0 ? opt_.eval_beam_size : opt_.beam_size);
  if (beam <= 1) return Tensor();
  BeamSearchOptions o;
  o.beam = beam;
  o.cosine = opt_.codebook.cosine;
  std::vector<Tensor> books;
  for (int l = 0; l < layers; ++l) {
    o.weights.push_back(opt_.beam_score_quantizer_weights.empty() ? 1.f : opt_.beam_score_quantizer_weights[l]);
    books.push_back(codebook(l).codes().detach());
  }
  return beam_search(z, books, o);
}

namespace {

// The layers' regularisers, summed over the layers that ran (undefined
// until one adds a term).
struct RegulariserSums {
  Tensor diversity, orthogonal;
};

Tensor accumulate(const Tensor& sum, const Tensor& term) { return sum.defined() ? add(sum, term) : term; }

// A layer's loss: its commitment (and codebook) term, then its own weighted
// diversity and orthogonal terms, as each layer of the reference is a
// VectorQuantize with the options; those terms also join the layers' sums.
// diveq: no commitment term, as the reference's layers (commitment_weight 0).
Tensor layer_loss(const ResidualVQOptions& o, const CodebookLayerStep& step, const Tensor& code, bool learnable,
                  const Tensor& zero, Communicator& comm, RegulariserSums& sums) {
  const Tensor& prepared = step.assignment.prepared;
  Tensor loss = o.diveq                        ? zero
                : step.cross_entropy.defined() ? mul(step.cross_entropy, o.commitment_weight)
                                               : quantization_loss(code, prepared, o.commitment_weight, learnable, comm);
  if (step.diversity.defined()) {
    loss = add(loss, mul(step.diversity, o.codebook_diversity_loss_weight));
    sums.diversity = accumulate(sums.diversity, step.diversity);
  }
  if (step.orthogonal.defined()) {
    loss = add(loss, mul(step.orthogonal, o.orthogonal_reg_weight));
    sums.orthogonal = accumulate(sums.orthogonal, step.orthogonal);
  }
  return loss;
}

// A layer's output. `prepared` is the residual (cosine: normalised, as the
// reference's layers normalise their input before the loss and the
// output). diveq: the layer's output is its (learnable) code itself, as the
// reference's layers route no gradient to their input there.
Tensor layer_output(const ResidualVQOptions& o, const Tensor& prepared, const Tensor& code, bool training) {
  Tensor quantized = o.diveq ? code : through_quantizer(prepared, code, o.rotation_trick && training);
  if (o.sync_update_v > 0 && training)  // per layer, as the reference's layers
    quantized = add(quantized, mul(sub(quantized, quantized.detach()), o.sync_update_v));
  return quantized;
}

// The residual the next layer quantizes. quant_grad_frac: frac q + (1 -
// frac) q.detach(), as the reference writes it (so its value rounds as
// there): the later layers' gradient reaches this layer's output in that
// share (diveq: all of it).
Tensor next_residual(const ResidualVQOptions& o, const Tensor& residual, const Tensor& quantized) {
  if (o.diveq) return sub(residual, quantized);
  if (o.quant_grad_frac > 0)
    return sub(residual, add(mul(quantized, o.quant_grad_frac), mul(quantized.detach(), 1.f - o.quant_grad_frac)));
  return sub(residual, quantized.detach());
}

// What the layers of a shared codebook leave for its one update after the
// last layer (training only): each layer's rows and codes, and their
// assignments for its in-place step.
struct SharedCodebookRows {
  bool ran = false;  // some layer used the shared codebook
  std::vector<Tensor> rows, idx;
  std::vector<CodebookAssignment> in_place;
  // A layer's assignment; `change`: the codebook updates this step.
  void add(const CodebookAssignment& a, bool change, bool in_place_step) {
    ran = true;
    if (!change) return;
    if (in_place_step) in_place.push_back(a);  // one step after the last layer
    rows.push_back(a.prepared.detach());
    idx.push_back(a.indices);
  }
};

// The shared codebook's one step and update, and its one metrics entry.
void update_shared_codebook(Codebook& book, SharedCodebookRows& s, const ResidualVQOptions& o, int64_t m, int64_t cd,
                            bool change, Communicator& comm, std::vector<CodebookMetrics>& metrics) {
  if (!s.in_place.empty()) in_place_codebook_step(book, s.in_place, o.in_place_codebook_lr, comm);
  if (!s.ran) return;
  if (!change) {
    metrics.push_back({});  // eval: one entry for the shared codebook, no rows to gather
    return;
  }
  // Rows example-major (row n's layers together), not layer-major: the
  // sampler numbers the global batch rank by rank, so only this order
  // gives the rows the same global numbers on any split, and revival the
  // same rows as 1 rank on the whole batch (invariant 2). Layer-major, 1
  // rank numbers all of layer 0 first, W ranks rank 0's layers first.
  int64_t layers = static_cast<int64_t>(s.rows.size());
  Tensor rows = reshape(transpose(reshape(concat(s.rows, 0), {layers, m, cd}), 0, 1), {m * layers, cd});
  Tensor idx = reshape(transpose(reshape(concat(s.idx, 0), {layers, m}), 0, 1), {m * layers});
  metrics.push_back(book.update_layers(s.rows, s.idx, rows, idx, comm));
}

// The total loss (the layers' sum) and the regularisers' sums as extras.
void add_totals(const ResidualVQOptions& o, const RegulariserSums& sums, const Tensor& zero, QuantizerOutput& out) {
  out.loss = zero;
  for (const Tensor& l : out.layer_losses) out.loss = add(out.loss, l);
  if (o.orthogonal_reg_weight > 0) out.extras["orthogonal_reg_loss"] = sums.orthogonal.defined() ? sums.orthogonal : zero;
  if (o.codebook_diversity_loss_weight > 0)
    out.extras["codebook_diversity_loss"] = sums.diversity.defined() ? sums.diversity : zero;
}

}  // namespace

QuantizerOutput ResidualVQ::quantize(const Tensor& x, Communicator& comm, const Tensor& mask) {
  VQDDP_CHECK(x.defined() && x.dim() == 2 && x.size(1) == opt_.dim, "rank {}: ResidualVQ expects [N, {}], got {}",
              comm.rank(), opt_.dim, x.desc());
  const int q = opt_.num_quantizers;
  MaskedRows rows(mask, x.size(0), comm.rank());
  Tensor z = rows.compact(x);                       // (M, dim)
  z = projection_.in(z);                            // (M, cd)
  int64_t m = z.size(0);
  bool update = updates_state();
  // A frozen codebook is assigned against (and k-means-initialised) but
  // never updated; its codes count as constants in the loss.
  const bool change = update && !opt_.freeze_codebook;
  RegulariserSums sums;
  // Dropout starts once every codebook is initialised: until then all layers
  // run, so k-means initialises each one and inference never meets a layer
  // that dropout happened to skip. Every rank sees the same initted flags.
  bool all_initted = std::all_of(books_.begin(), books_.end(), [](const auto& b) { return b->initted(); });
  int last = last_active_layer(opt_.quantize_dropout, q, update && all_initted, opt_.seed, dropout_step_);

  QuantizerOutput out;
  out.active_layers = last + 1;
  // The beam's paths, once every codebook holds codes (the k-means step
  // assigns greedily); rows only, so no collective and the same on any split.
  std::vector<Tensor> paths;
  if (all_initted)
    if (Tensor p = search_paths(z, last + 1); p.defined()) paths = split_columns(p);
  Tensor residual = z, sum = zeros({m, codebook_dim_}, DType::f32, z.device());
  const Tensor zero = full({}, 0.0, DType::f32, z.device());  // the loss of a layer that did not run
  std::vector<Tensor> idx_columns(q, full({m}, -1, DType::i64, z.device()));  // -1: layer did not run
  SharedCodebookRows shared;
  for (int l = 0; l < q; ++l) {
    if (l > last) {
      out.layer_losses.push_back(zero);
      continue;
    }
    Codebook& book = *books_[opt_.shared_codebook ? 0 : l];
    // The layer's codebook step (vq/codebook_layer.h), with the beam's codes
    // when it searched; a shared codebook steps and updates once, below.
    std::optional<CodebookLayerStep> step =
        codebook_layer_step(book, residual, comm, {opt_, opt_.in_place_codebook_lr, update, opt_.shared_codebook},
                            paths.empty() ? Tensor() : paths[l]);
    if (!step) {
      // No rank has rows: nothing to quantize on any rank.
      out.layer_losses.push_back(zero);
      out.metrics.push_back(CodebookMetrics::empty_world());
      continue;
    }
    const CodebookAssignment& a = step->assignment;
    const bool learnable = book.options().learnable && !opt_.freeze_codebook;
    const Tensor code = learnable ? a.codes : a.codes.detach();  // (M, cd)
    if (opt_.shared_codebook)
      shared.add(a, change, opt_.in_place_codebook_lr > 0);
    else
      out.metrics.push_back(step->metrics);
    out.layer_losses.push_back(layer_loss(opt_, *step, code, learnable, zero, comm, sums));
    const Tensor quantized = layer_output(opt_, a.prepared, code, is_training());
    residual = next_residual(opt_, residual, quantized);
    sum = add(sum, quantized);
    idx_columns[l] = a.indices;
  }
  if (opt_.shared_codebook) update_shared_codebook(*books_[0], shared, opt_, m, codebook_dim_, change, comm, out.metrics);
  add_totals(opt_, sums, zero, out);
  if (opt_.diveq && updates_state()) {
    // DiVeQ on the whole output: the input moved along the noised direction
    // to the codes' sum (vq/directional_reparam.h), global row g's noise
    // from one shared stream per step. Training only (the reference applies
    // it in eval too, so its eval outputs are noisy).
    sum = directional_reparam(z, sum, kDirectionalReparamVariance, first_global_row(comm, m), books_[0]->draw_stream());
  }
  Tensor y = projection_.out(sum);  // (M, dim)
  out.quantized = rows.expand(y, x);
  out.indices = rows.expand_indices(stack_columns(idx_columns));
  if (!opt_.shared_codebook)
    while (out.metrics.size() < static_cast<size_t>(q)) out.metrics.push_back(CodebookMetrics::empty_world());
  return out;
}

std::vector<Tensor> ResidualVQ::get_codes_from_indices(const Tensor& indices) const {
  const int q = opt_.num_quantizers;
  VQDDP_CHECK(indices.dtype() == DType::i64 && indices.dim() == 2 && indices.size(1) == q,
              "ResidualVQ: expected int64 indices [N, {}], got {}", q, indices.desc());
  std::vector<Tensor> layers = split_columns(indices), codes;
  for (int l = 0; l < q; ++l) {
    const Codebook& book = codebook(l);
    codes.push_back(
        codes_or_zero(layers[l], codebook_dim_, [&](const Tensor& i) { return book.lookup(i.to(book.embed.device())); }));
  }
  return codes;
}

Tensor ResidualVQ::decode(const Tensor& indices) const {
  Tensor sum = zeros({indices.size(0), codebook_dim_}, DType::f32, codebook(0).embed.device());
  for (const Tensor& c : get_codes_from_indices(indices)) sum = add(sum, c);
  return projection_.out(sum);
}

std::vector<int64_t> ResidualVQ::layer_sizes() const {
  std::vector<int64_t> sizes;
  for (int l = 0; l < opt_.num_quantizers; ++l) sizes.push_back(codebook(l).options().codebook_size);
  return sizes;
}

// ---- the "residual_vq" kind (vq/quantizer_kind.h) --------------------------------

namespace {

void read_residual_vq(ConfigSection& s, ResidualVQOptions& o, int64_t dim) {
  o.codebook_size = s.integer("codebook_size", o.codebook_size, limits::codebook_size);
  o.num_quantizers = static_cast<int>(s.integer("num_quantizers", o.num_quantizers, limits::layers));
  o.codebook_dim = s.integer("codebook_dim", o.codebook_dim, limits::codebook_dim);
  read_codebook_loss_keys(s, o, o.codebook);
  read_in_place_optimizer(s, o.in_place_codebook_lr, o.codebook);
  o.shared_codebook = s.boolean("shared_codebook", o.shared_codebook);
  o.quant_grad_frac = static_cast<float>(s.number("quant_grad_frac", o.quant_grad_frac));
  if (!(o.quant_grad_frac >= 0 && o.quant_grad_frac <= 1)) s.fail("quant_grad_frac", "must be in [0, 1]");
  o.diveq = s.boolean("diveq", o.diveq);
  if (o.diveq && (!o.codebook.learnable || o.codebook.cosine))
    s.fail("diveq", "needs \"learnable_codebook\": true and a Euclidean codebook (the codes learn through the output)");
  o.beam_size = static_cast<int>(s.integer("beam_size", o.beam_size, limits::beam));
  o.eval_beam_size = static_cast<int>(s.integer("eval_beam_size", o.eval_beam_size, {1, limits::beam.hi}));
  std::vector<double> w(o.beam_score_quantizer_weights.begin(), o.beam_score_quantizer_weights.end());
  w = s.numbers("beam_score_quantizer_weights", w);
  if (!w.empty() && static_cast<int64_t>(w.size()) != o.num_quantizers)
    s.fail("beam_score_quantizer_weights",
           fmt::format("must hold one weight per quantizer ({}), got {}", o.num_quantizers, w.size()));
  o.beam_score_quantizer_weights.assign(w.begin(), w.end());
  if ((o.beam_size > 1 || o.eval_beam_size > 1) && (o.codebook.stochastic_sample || o.codebook.affine_param ||
                                                     o.commitment_use_cross_entropy_loss || o.in_place_codebook_lr > 0))
    s.fail("beam_size", "does not go with stochastic_sample_codes, affine_param, commitment_use_cross_entropy_loss or "
                        "in_place_codebook_optimizer");
  read_quantize_dropout(s, o.quantize_dropout, o.num_quantizers);
  if (dim > 0)
    s.check_elements("codebook_size", "codebook_size x codebook_dim x num_quantizers",
                     {o.codebook_size, o.codebook_dim > 0 ? o.codebook_dim : dim,
                      o.shared_codebook ? 1 : int64_t{o.num_quantizers}});
}

}  // namespace

const QuantizerKind& residual_vq_kind() {
  static const QuantizerKind kind = [] {
    ResidualVQOptions defaults;
    defaults.codebook_size = 256;
    defaults.num_quantizers = 4;
    QuantizerKind k = make_kind<ResidualVQ, ResidualVQOptions>("residual_vq", defaults, read_residual_vq);
    k.residual = true;
    k.test_keys = {{"codebook_size", 16},           {"num_quantizers", 3},     {"kmeans_init", true},
                   {"kmeans_iters", 3},             {"threshold_ema_dead_code", 1.5}, {"quantize_dropout", true}};
    k.reference_class = "ResidualVQ";
    k.reference_defaults = [](QuantizerOptions& q, int64_t dim) {
      auto& o = q.as<ResidualVQOptions>();
      reference_codebook_defaults(o, o.codebook, dim);
    };
    k.reference_slots = [](const QuantizerOptions& q, const std::string& ours) {
      const std::string book = codebook_of(ours);
      std::vector<std::string> places;
      if (book == "codebook") {  // shared: the reference holds it under every layer
        for (int l = 0; l < q.as<ResidualVQOptions>().num_quantizers; ++l)
          places.push_back(fmt::format("layers.{}._codebook.", l));
      } else if (book.starts_with("layer")) {  // layer<l>
        places.push_back(fmt::format("layers.{}._codebook.", book.substr(std::string("layer").size())));
      }
      std::optional<std::vector<ReferenceSlot>> slots;
      if (!places.empty()) slots = codebook_slots(ours, places);
      return slots ? *slots : std::vector<ReferenceSlot>{{ours, ours}};
    };
    return k;
  }();
  return kind;
}

}  // namespace vqddp
