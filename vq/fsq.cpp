#include "vq/fsq.h"

#include <cmath>

#include "engine/ops.h"
#include "vq/losses.h"

namespace vqddp {

namespace {

// Rounds half away from zero (std::round), as a straight-through op: the
// value of round(v), the gradient of v. On a GPU the rounding runs on a host
// copy (FSQ's codes are small: M x D with D of 3 to 8), so both devices
// round with the same std::round.
Tensor round_straight_through(const Tensor& v) {
  Tensor r = v.device().is_cpu() ? v.detach().clone() : v.detach().to(Device::cpu());  // one copy either way
  float* p = r.data<float>();
  for (int64_t i = 0; i < r.numel(); ++i) p[i] = std::round(p[i]);
  return straight_through(v, r.to(v.device()));
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
  std::vector<float> half_l, offset, shift, half_width;
  for (int l : o.levels) {
    VQDDP_CHECK(l >= 2, "FSQ: every level must be at least 2, got {}", l);
    float h = (l - 1) * (1.f + 1e-3f) / 2.f;
    float off = l % 2 == 0 ? 0.5f : 0.f;
    half_l.push_back(h);
    offset.push_back(off);
    shift.push_back(std::atanh(off / h));
    half_width.push_back(static_cast<float>(l / 2));
  }
  codebook_size_ = fsq_codebook_size(o.levels);
  int64_t d = code_dim();
  half_l_ = from_vector(half_l, {d});
  offset_ = from_vector(offset, {d});
  shift_ = from_vector(shift, {d});
  half_width_ = from_vector(half_width, {d});
  basis_.push_back(1);
  for (size_t j = 0; j + 1 < o.levels.size(); ++j) basis_.push_back(basis_.back() * o.levels[j]);
  int64_t inner = d * o.num_codebooks;
  if (o.dim == 0) opt_.dim = inner;
  if (opt_.dim != inner) {
    project_in_ = register_module("project_in", std::make_shared<Linear>(opt_.dim, inner, init_gen));
    project_out_ = register_module("project_out", std::make_shared<Linear>(inner, opt_.dim, init_gen));
  }
}

Tensor FSQ::quantize(const Tensor& z) const {
  VQDDP_CHECK(z.dtype() == DType::f32 && z.dim() == 2 && z.size(1) == code_dim(), "FSQ: expected float32 [M, {}], got {}",
              code_dim(), z.desc());
  // A diverging encoder must stop here: round(NaN) has no index.
  if (int64_t at = first_nonfinite(z); at >= 0)
    VQDDP_THROW_NONFINITE("FSQ: row {} has a non-finite value ({} in column {})", at / code_dim(),
                z.detach().reshape({-1}).slice_rows(at, at + 1).item<float>(), at % code_dim());
  // The constants live on the host (they are not state, so Module::to does
  // not move them); to() is free where z is on the host too.
  Device dev = z.device();
  Tensor bounded = sub(mul(vqddp::tanh(add(z, shift_.to(dev))), half_l_.to(dev)), offset_.to(dev));
  return div(round_straight_through(bounded), half_width_.to(dev));
}

// The index arithmetic runs on the host; indices go back to the codes' device.
Tensor FSQ::codes_to_indices(const Tensor& codes_any) const {
  Tensor codes = codes_any.detach().to(Device::cpu());  // indices carry no gradient
  int64_t m = codes.size(0), d = code_dim();
  Tensor out = empty({m}, DType::i64);
  const float* pc = codes.data<float>();
  const float* hw = half_width_.data<float>();
  int64_t* po = out.data<int64_t>();
  for (int64_t i = 0; i < m; ++i) {
    int64_t idx = 0;
    for (int64_t j = 0; j < d; ++j) idx += static_cast<int64_t>(std::lround(pc[i * d + j] * hw[j] + hw[j])) * basis_[j];
    po[i] = idx;
  }
  return out.to(codes_any.device());
}

Tensor FSQ::indices_to_codes(const Tensor& indices_any) const {
  Tensor indices = indices_any.to(Device::cpu());
  int64_t m = indices.numel(), d = code_dim();
  Tensor out = empty({m, d});
  const int64_t* pi = indices.data<int64_t>();
  const float* hw = half_width_.data<float>();
  float* po = out.data<float>();
  for (int64_t i = 0; i < m; ++i) {
    VQDDP_CHECK(pi[i] >= 0 && pi[i] < codebook_size_, "FSQ: index {} outside [0, {})", pi[i], codebook_size_);
    for (int64_t j = 0; j < d; ++j)
      po[i * d + j] = (static_cast<float>((pi[i] / basis_[j]) % opt_.levels[j]) - hw[j]) / hw[j];
  }
  return out.to(indices_any.device());
}

FSQOutput FSQ::forward(const Tensor& x) {
  VQDDP_CHECK(x.defined() && x.dtype() == DType::f32 && x.dim() == 2 && x.size(1) == opt_.dim,
              "FSQ expects float32 [N, {}], got {}", opt_.dim, x.desc());
  int64_t n = x.size(0), c = opt_.num_codebooks, d = code_dim();
  Tensor z = project_in_ ? project_in_->forward(x) : x;  // (N, C*D)
  Tensor zhat = quantize(reshape(z, {n * c, d}));        // (N*C, D)
  Tensor idx = codes_to_indices(zhat);                   // (N*C)
  Tensor y = reshape(zhat, {n, c * d});
  if (project_out_) y = project_out_->forward(y);
  return {y, c == 1 ? idx : reshape(idx, {n, c})};
}

Tensor FSQ::decode(const Tensor& indices) const {
  int64_t c = opt_.num_codebooks;
  VQDDP_CHECK(indices.dtype() == DType::i64 && indices.numel() % c == 0, "FSQ decode: bad indices {}", indices.desc());
  int64_t n = indices.numel() / c;
  Tensor y = reshape(indices_to_codes(indices.reshape({-1})), {n, c * code_dim()});
  return project_out_ ? project_out_->forward(y) : y;
}

}  // namespace vqddp
