#include "vq/fsq.h"

#include <cmath>

#include "engine/autograd.h"
#include "engine/core/count_limits.h"
#include "engine/ops.h"
#include "vq/finite_rows.h"
#include "vq/losses.h"
#include "vq/kernels/vq_kernels.h"
#include "vq/quantizer_kind.h"

namespace vqddp {

namespace {

// Rounds half away from zero (std::round), as a straight-through op: the
// value of round(v), the gradient of v. A device op, so a GPU step rounds
// where its codes are.
Tensor round_straight_through(const Tensor& v) {
  Tensor r;
  {
    NoGradGuard no_grad;
    r = vqddp::round(v.detach());
  }
  return straight_through(v, r);
}

// floor(v) in value, v's gradient (the reference's floor_ste).
Tensor floor_straight_through(const Tensor& v) {
  Tensor r;
  {
    NoGradGuard no_grad;
    r = vqddp::floor(v.detach());
  }
  return straight_through(v, r);
}

}  // namespace

int64_t fsq_codebook_size(const std::vector<int>& levels) {
  int64_t n = 1;
  for (int l : levels)
    VQDDP_CHECK(!__builtin_mul_overflow(n, int64_t{l}, &n), "FSQ: the product of levels [{}] overflows int64",
                fmt::join(levels, ", "));
  return n;
}

FSQ::FSQ(const FSQOptions& o, Generator& init_gen) : opt_(o) {
  VQDDP_CHECK(!o.levels.empty() && o.num_codebooks >= 1, "FSQ: needs at least one level and one codebook");
  std::vector<float> half_l, offset, shift, half_width, levels_minus_1, step;
  for (int l : o.levels) {
    VQDDP_CHECK(l >= 2, "FSQ: every level must be at least 2, got {}", l);
    float h = (l - 1) * (1.f + 1e-3f) / 2.f;
    float off = l % 2 == 0 ? 0.5f : 0.f;
    half_l.push_back(h);
    offset.push_back(off);
    shift.push_back(o.bound_hard_clamp ? off / h : std::atanh(off / h));
    half_width.push_back(o.preserve_symmetry ? static_cast<float>(l - 1) / 2.f : static_cast<float>(l / 2));
    levels_minus_1.push_back(static_cast<float>(l - 1));
    step.push_back(2.f / static_cast<float>(l - 1));
  }
  codebook_size_ = fsq_codebook_size(o.levels);
  int64_t d = code_dim();
  std::vector<int64_t> levels(o.levels.begin(), o.levels.end()), basis{1};
  for (size_t j = 0; j + 1 < o.levels.size(); ++j) basis.push_back(basis.back() * o.levels[j]);
  half_l_ = constants_.add(from_vector(half_l, {d}));
  offset_ = constants_.add(from_vector(offset, {d}));
  shift_ = constants_.add(from_vector(shift, {d}));
  half_width_ = constants_.add(from_vector(half_width, {d}));
  levels_minus_1_ = constants_.add(from_vector(levels_minus_1, {d}));
  step_ = constants_.add(from_vector(step, {d}));
  levels_ = constants_.add(from_vector(levels, {d}));
  basis_ = constants_.add(from_vector(basis, {d}));
  int64_t inner = d * o.num_codebooks;
  if (o.dim == 0) opt_.dim = inner;
  projection_ = make_projection(opt_.dim, inner, init_gen);
}

Tensor FSQ::round_codes(const Tensor& z) const {
  VQDDP_CHECK(z.dtype() == DType::f32 && z.dim() == 2 && z.size(1) == code_dim(), "FSQ: expected float32 [M, {}], got {}",
              code_dim(), z.desc());
  // A diverging encoder must stop here: round(NaN) has no index. Checked
  // where the check is free (the host); on a device the NaN reaches the
  // loss, which the trainer reads when it logs (one read per call would
  // make every step wait). In a training step quantize() has checked every
  // rank's input alike first (vq/finite_rows.h); this catches inference.
  if (z.device().is_cpu())
    if (int64_t at = first_nonfinite(z); at >= 0)
      VQDDP_THROW_NONFINITE("FSQ: row {} has a non-finite value ({} in column {})", at / code_dim(),
                            z.detach().reshape({-1}).slice_rows(at, at + 1).item<float>(), at % code_dim());
  Device dev = z.device();
  auto squash = [&](const Tensor& v) { return opt_.bound_hard_clamp ? clamp(v, -1.f, 1.f) : vqddp::tanh(v); };
  if (opt_.preserve_symmetry) {  // the reference's operation order, for its float32 bits
    Tensor bracket = add(div(mul(constant(levels_minus_1_, dev), add(squash(z), 1.f)), 2.f), 0.5f);
    return sub(mul(constant(step_, dev), floor_straight_through(bracket)), 1.f);
  }
  Tensor bounded = sub(mul(squash(add(z, constant(shift_, dev))), constant(half_l_, dev)), constant(offset_, dev));
  return div(round_straight_through(bounded), constant(half_width_, dev));
}

Tensor FSQ::codes_to_indices(const Tensor& codes) const {
  VQDDP_CHECK(codes.dtype() == DType::f32 && codes.dim() == 2 && codes.size(1) == code_dim(),
              "FSQ: expected float32 codes [M, {}], got {}", code_dim(), codes.desc());
  Device dev = codes.device();
  Tensor out = empty({codes.size(0)}, DType::i64, dev);
  vq_kernels(dev).fsq_indices(codes.detach(), constant(half_width_, dev), constant(basis_, dev), out);
  return out;
}

Tensor FSQ::indices_to_codes(const Tensor& indices) const {
  // Indices from outside (a decode input): checked, one read on a device.
  check_index_range(indices.reshape({-1}), codebook_size_, "FSQ");
  Device dev = indices.device();
  Tensor out = empty({indices.numel(), code_dim()}, DType::f32, dev);
  vq_kernels(dev).fsq_codes(indices.reshape({-1}), constant(levels_, dev), constant(half_width_, dev),
                            constant(basis_, dev), out);
  return out;
}

Tensor FSQ::decode(const Tensor& indices) const {
  int64_t c = opt_.num_codebooks;
  VQDDP_CHECK(indices.dtype() == DType::i64 && indices.numel() % c == 0, "FSQ decode: bad indices {}", indices.desc());
  int64_t n = indices.numel() / c;
  Tensor y = reshape(indices_to_codes(indices.reshape({-1})), {n, c * code_dim()});
  return projection_.out(y);
}

QuantizerOutput FSQ::quantize(const Tensor& x, Communicator& comm, const Tensor& mask) {
  refuse_mask(mask, "FSQ", comm.rank());
  // A training step: every rank alike, before this rank's own check.
  // Inference (eval or no-grad, as the Codebook's) issues no collective:
  // ranks may hold no rows there, and the local check throws.
  VQDDP_CHECK(x.defined() && x.dtype() == DType::f32 && x.dim() == 2 && x.size(1) == opt_.dim,
              "rank {}: FSQ expects float32 [N, {}], got {}", comm.rank(), opt_.dim, x.desc());
  if (updates_state()) refuse_nonfinite_rows(x, comm, "FSQ's input");
  int64_t n = x.size(0), c = opt_.num_codebooks, d = code_dim();
  Tensor z = projection_.in(x);                       // (N, C*D)
  Tensor zhat = round_codes(reshape(z, {n * c, d}));  // (N*C, D)
  Tensor idx = codes_to_indices(zhat);                // (N*C)
  Tensor y = reshape(zhat, {n, c * d});
  return without_loss(projection_.out(y), reshape(idx, {n, c}), opt_.num_codebooks);
}

// ---- the "fsq" kind (vq/quantizer_kind.h) ----------------------------------------

namespace {

void read_fsq(ConfigSection& s, FSQOptions& o, int64_t) {
  read_levels(s, o.levels, "fsq");
  o.num_codebooks = static_cast<int>(s.integer("num_codebooks", o.num_codebooks, limits::heads));
  // The reference's: one index column per codebook, which is our only layout.
  if (!s.boolean("keep_num_codebooks_dim", true) && o.num_codebooks > 1)
    s.fail("keep_num_codebooks_dim", "must be true with num_codebooks > 1");
  o.preserve_symmetry = s.boolean("preserve_symmetry", o.preserve_symmetry);
  o.bound_hard_clamp = s.boolean("bound_hard_clamp", o.bound_hard_clamp);
}

}  // namespace

const QuantizerKind& fsq_kind() {
  static const QuantizerKind kind = [] {
    QuantizerKind k = make_kind<FSQ, FSQOptions>("fsq", {}, read_fsq);
    k.test_keys = {{"levels", {5, 4, 3}}};
    k.reference_class = "FSQ";
    k.reference_dim = [](const QuantizerOptions& q) {
      const auto& o = q.as<FSQOptions>();
      return static_cast<int64_t>(o.levels.size()) * o.num_codebooks;
    };
    return k;
  }();
  return kind;
}

}  // namespace vqddp
