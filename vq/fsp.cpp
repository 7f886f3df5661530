#include "vq/fsp.h"

#include <algorithm>

#include <cfloat>

#include "comm/batch_reduce.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/core/streams.h"
#include "vq/finite_rows.h"
#include "vq/fsq.h"
#include "vq/kernels/vq_kernels.h"
#include "vq/losses.h"
#include "vq/quantizer_kind.h"

namespace vqddp {

namespace {

constexpr float kEps = FLT_EPSILON;              // the reference's torch.finfo(float32).eps
constexpr float kUniformStd = 0.28867513459481287f;  // sqrt(1/12): the std of U(0, 1)
// The CDFs' constants: the reference's Python floats sqrt(2) and pi, as
// float32 tensor arithmetic takes them.
constexpr float kSqrt2 = 1.41421356237309504880f;
constexpr float kPi = 3.14159265358979323846f;

// The reference's VectorNorm presets: (target, weight) of the mean,
// variance, skewness and kurtosis terms.
struct NormPreset {
  const char* name;
  float target[4], weight[4];
};
constexpr NormPreset kNormPresets[] = {
    {"none", {0.f, 1.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}},
    {"var", {0.f, 1.f, 0.f, 0.f}, {0.1f, 0.07f, 0.f, 0.f}},
    {"kurt", {0.f, 1.f, 0.f, 0.f}, {0.1f, 0.07f, 0.06f, 0.05f}},
    {"var_tanh", {0.f, 0.8225f, 0.f, 0.f}, {0.1f, 0.07f, 0.f, 0.f}},
    {"var_sigmoid", {0.f, 3.29f, 0.f, 0.f}, {0.1f, 0.07f, 0.f, 0.f}},
    {"var_laplace", {0.f, 2.f, 0.f, 0.f}, {0.1f, 0.07f, 0.f, 0.f}},
};

const NormPreset& norm_preset(const std::string& name) {
  for (const NormPreset& p : kNormPresets)
    if (name == p.name) return p;
  VQDDP_THROW("FSP: unknown vector_norm preset '{}'", name);
}

// Sums over the batch's rows (M, K) -> (K): the global batch's in a
// training step (differentiable, the exact step's order), this rank's in
// inference (no collective).
Tensor row_sums(const Tensor& x, Communicator& comm, bool global) {
  return global ? batch_sum(x, comm) : sum(x, 0);
}

// The reference's batch_stats and VectorNorm: sum_i weight_i * mean((s_i - target_i)^2)
// over the per-dimension mean, unbiased variance, skewness and excess kurtosis.
//
// The central sums T_k = sum (z - mu)^k are taken around mu DETACHED, so
// that no batched op consumes the global mu (its gradient would then be a
// sum over this rank's rows only). Their dependence on mu, dT_k/dmu =
// -k T_(k-1), is added back through a term of value exactly 0,
// -k T_(k-1) (mu - mu.detach()), so the gradient is the global one and
// reaches the rows through mu = S_1 / n alone.
Tensor vector_norm_loss(const Tensor& z, const NormPreset& preset, Communicator& comm, bool global) {
  const int64_t m = z.size(0), c = z.size(1);
  const Device dev = z.device();
  Tensor firsts = row_sums(concat({z, full({m, 1}, 1.0, DType::f32, dev)}, 1), comm, global);  // (C + 1)
  Tensor n = clamp(firsts.slice_rows(c, c + 1), 1.f, FLT_MAX);  // rows (at least 1: an empty batch has zero moments)
  Tensor mu = div(firsts.slice_rows(0, c), n);                    // (C)
  Tensor centred = sub(z, reshape(mu.detach(), {1, c}));
  Tensor sq = square(centred);
  Tensor t = row_sums(concat({centred, sq, mul(sq, centred), square(sq)}, 1), comm, global);  // (4C): T_1..T_4
  auto central = [&](int k) {
    Tensor tk = t.slice_rows((k - 1) * c, k * c);
    return sub(tk, mul(mul(t.slice_rows((k - 2) * c, (k - 1) * c).detach(), sub(mu, mu.detach())), static_cast<float>(k)));
  };
  Tensor variance = div(central(2), clamp(sub(n, 1.f), 1.f, FLT_MAX));  // unbiased
  Tensor std = clamp(vqddp::sqrt(variance), 1e-8f, FLT_MAX);
  Tensor std2 = square(std);
  Tensor skewness = div(div(central(3), n), mul(std2, std));
  Tensor kurtosis = sub(div(div(central(4), n), square(std2)), 3.f);
  Tensor loss = full({}, 0.0, DType::f32, dev);
  const Tensor stats[4] = {mu, variance, skewness, kurtosis};
  for (int i = 0; i < 4; ++i)
    if (preset.weight[i] != 0.f)
      loss = add(loss, mul(vqddp::mean(square(sub(stats[i], preset.target[i]))), preset.weight[i]));
  return loss;
}

}  // namespace

const std::vector<std::string>& fsp_activations() {
  static const std::vector<std::string> names{"tanh", "sigmoid", "normal", "laplace", "cauchy"};
  return names;
}

const std::vector<std::string>& fsp_vector_norms() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const NormPreset& p : kNormPresets) n.push_back(p.name);
    return n;
  }();
  return names;
}

FSP::FSP(const FSPOptions& o, Generator& init_gen) : opt_(o) {
  VQDDP_CHECK(!o.levels.empty(), "FSP: levels must not be empty");
  VQDDP_CHECK(o.quantize_rate >= 0 && o.quantize_rate <= 1, "FSP: quantize_rate {} must be in [0, 1]", o.quantize_rate);
  const std::vector<std::string>& acts = fsp_activations();
  VQDDP_CHECK(std::find(acts.begin(), acts.end(), o.act_name) != acts.end(), "FSP: act_name '{}' must be one of {}",
              o.act_name, fmt::join(acts, ", "));
  // The reference inverts the normal CDF with erfinv, which no C library
  // has (and so neither engine backend's shared math).
  VQDDP_CHECK(!(o.need_inv_act && o.act_name == "normal"),
              "FSP: need_inv_act with act_name 'normal' is not built (it needs erfinv)");
  norm_preset(o.vector_norm);
  const int64_t c = static_cast<int64_t>(o.levels.size());
  std::vector<float> levels_f;
  std::vector<int64_t> levels, basis{1};
  for (int l : o.levels) {
    VQDDP_CHECK(l >= 2, "FSP: every level must be at least 2, got {}", l);
    levels_f.push_back(static_cast<float>(l));
    half_bins_.push_back(1.f / (2.f * static_cast<float>(l)));
    levels.push_back(l);
  }
  for (int64_t j = 0; j + 1 < c; ++j) basis.push_back(basis.back() * o.levels[j]);
  codebook_size_ = fsq_codebook_size(o.levels);
  levels_f_ = constants_.add(from_vector(levels_f, {c}));
  ones_ = constants_.add(full({c}, 1.0));
  levels_ = constants_.add(from_vector(levels, {c}));
  basis_ = constants_.add(from_vector(basis, {c}));
  if (o.dim == 0) opt_.dim = c;
  projection_ = make_projection(opt_.dim, c, init_gen);
  step_ = register_buffer("perturb_step", zeros({1}, DType::i64), ValueRange::non_negative());
}

// The CDFs in the reference's operation order.
Tensor FSP::activation(const Tensor& z) const {
  if (opt_.act_name == "sigmoid") return sigmoid(z);
  if (opt_.act_name == "normal") return div(add(vqddp::erf(div(z, kSqrt2)), 1.f), 2.f);  // (1 + erf(z/sqrt2)) / 2
  if (opt_.act_name == "laplace")  // 0.5 (1 + sign(z) (1 - e^-|z|))
    return mul(add(mul(vqddp::sign(z), add(neg(vqddp::exp(neg(vqddp::abs(z)))), 1.f)), 1.f), 0.5f);
  if (opt_.act_name == "cauchy") return add(div(vqddp::atan(z), kPi), 0.5f);  // atan(z)/pi + 0.5
  return mul(add(vqddp::tanh(z), 1.f), 0.5f);  // (tanh(z) + 1) / 2
}

Tensor FSP::inverse_activation(const Tensor& p) const {
  if (opt_.act_name == "sigmoid") return log(div(p, add(neg(p), 1.f)));  // logit(p) = log(p / (1 - p))
  if (opt_.act_name == "laplace") {  // -sign(p - 0.5) log(1 - 2 |p - 0.5|)
    Tensor c = sub(p, 0.5f);
    return neg(mul(vqddp::sign(c), log(add(neg(mul(vqddp::abs(c), 2.f)), 1.f))));
  }
  if (opt_.act_name == "cauchy") return vqddp::tan(mul(sub(p, 0.5f), kPi));  // tan((p - 0.5) pi)
  Tensor y = sub(mul(p, 2.f), 1.f);                                      // atanh(y), y = 2p - 1
  return mul(log(div(add(y, 1.f), add(neg(y), 1.f))), 0.5f);
}

Tensor FSP::output_of(const Tensor& q, const Tensor& z) const {
  if (!opt_.need_inv_act) return div(sub(q, 0.5f), kUniformStd);
  Tensor v = inverse_activation(clamp(q, kEps, 1.f - kEps));
  return z.defined() ? straight_through(z, v) : v;
}

void FSP::perturbation_noise(int64_t rows, Communicator& comm, Tensor& offset, Tensor& use) {
  const int64_t c = static_cast<int64_t>(opt_.levels.size());
  const int64_t first = first_global_row(comm, rows);  // host numbers: no device wait
  int64_t& step = step_.data<int64_t>()[0];
  step_.bump_version();
  Generator gen(opt_.seed, streams::kPerturbation + static_cast<uint64_t>(step++));
  gen.advance(static_cast<uint64_t>(first) * static_cast<uint64_t>(c) * 2);
  Tensor off = empty({rows, c}), keep = empty({rows, c});
  float *po = off.data<float>(), *pk = keep.data<float>();
  for (int64_t i = 0; i < rows * c; ++i) {
    const float u1 = gen.uniform(), u2 = gen.uniform();
    po[i] = half_bins_[i % c] * (u1 * 2.f - 1.f);
    pk[i] = u2 > opt_.quantize_rate ? 1.f : 0.f;
  }
  offset = off;  // per-row constants of the step (no gradient)
  use = keep;
}

QuantizerOutput FSP::quantize(const Tensor& x, Communicator& comm, const Tensor& mask) {
  refuse_mask(mask, "FSP", comm.rank());
  VQDDP_CHECK(x.defined() && x.dtype() == DType::f32 && x.dim() == 2 && x.size(1) == opt_.dim,
              "rank {}: FSP expects float32 [N, {}], got {}", comm.rank(), opt_.dim, x.desc());
  const bool training = updates_state();
  if (training) refuse_nonfinite_rows(x, comm, "FSP's input");
  const int64_t m = x.size(0);
  const Device dev = x.device();
  Tensor z = projection_.in(x);  // (M, C)
  QuantizerOutput out;
  out.loss = vector_norm_loss(z, norm_preset(opt_.vector_norm), comm, training);
  Tensor a = activation(z);
  Tensor level = floor(mul(clamp(a.detach(), -FLT_MAX, 1.f - kEps), constants_.on(levels_f_, dev)));  // (M, C)
  Tensor q = straight_through(a, div(add(level, 0.5f), constants_.on(levels_f_, dev)));
  if (training && opt_.quantize_rate < 1.f) {
    Tensor offset, use;
    perturbation_noise(m, comm, offset, use);
    Tensor proposal = add(a, offset.to(dev));
    // Kept where 0 < p < 1: mask * p + (1 - mask) * a is exactly one of them.
    Tensor accept = mul(positive(proposal.detach()), positive(add(neg(proposal.detach()), 1.f)));
    Tensor perturbed = add(mul(accept, proposal), mul(add(neg(accept), 1.f), a));
    Tensor u = use.to(dev);
    q = add(mul(u, perturbed), mul(add(neg(u), 1.f), q));
    out.extras["p_accept_prob"] = global_mean_or_zero(accept, comm);
  }
  // Index digits l_j through FSQ's kernel: a "code" of l - 1 with half width
  // 1 is digit round((l - 1) * 1 + 1) = l, exactly.
  Tensor idx = empty({m}, DType::i64, dev);
  vq_kernels(dev).fsq_indices(sub(level, 1.f), constants_.on(ones_, dev), constants_.on(basis_, dev), idx);
  out.quantized = projection_.out(output_of(q, z));
  out.indices = reshape(idx, {m, 1});
  out.layer_losses = {out.loss};
  out.active_layers = 1;
  return out;
}

Tensor FSP::decode(const Tensor& indices) const {
  VQDDP_CHECK(indices.dtype() == DType::i64 && (indices.dim() == 1 || (indices.dim() == 2 && indices.size(1) == 1)),
              "FSP decode: expected int64 indices [N] or [N, 1], got {}", indices.desc());
  check_index_range(indices.reshape({-1}), codebook_size_, "FSP");
  const Device dev = indices.device();
  const int64_t n = indices.numel(), c = static_cast<int64_t>(opt_.levels.size());
  Tensor digits = empty({n, c}, DType::f32, dev);  // l - 1 (FSQ's code of digit l with half width 1)
  vq_kernels(dev).fsq_codes(indices.reshape({-1}), constants_.on(levels_, dev), constants_.on(ones_, dev),
                            constants_.on(basis_, dev), digits);
  Tensor q = div(add(digits, 1.5f), constants_.on(levels_f_, dev));  // (l + 0.5) / L
  return projection_.out(output_of(q, Tensor()));
}

// ---- the "fsp" kind (vq/quantizer_kind.h) ----------------------------------------

namespace {

void read_fsp(ConfigSection& s, FSPOptions& o, int64_t) {
  read_levels(s, o.levels, "fsp");
  o.act_name = s.choice("act_name", o.act_name, fsp_activations());
  o.quantize_rate = static_cast<float>(s.number("quantize_rate", o.quantize_rate));
  if (!(o.quantize_rate >= 0 && o.quantize_rate <= 1)) s.fail("quantize_rate", "must be in [0, 1]");
  o.need_inv_act = s.boolean("need_inv_act", o.need_inv_act);
  o.vector_norm = s.choice("vector_norm", o.vector_norm, fsp_vector_norms());
}

}  // namespace

const QuantizerKind& fsp_kind() {
  static const QuantizerKind kind = [] {
    QuantizerKind k = make_kind<FSP, FSPOptions>("fsp", {}, read_fsp);
    k.test_keys = {{"levels", {5, 4, 3}}};
    k.reference_class = "FSP";
    k.reference_dim = [](const QuantizerOptions& q) { return static_cast<int64_t>(q.as<FSPOptions>().levels.size()); };
    return k;
  }();
  return kind;
}

}  // namespace vqddp
