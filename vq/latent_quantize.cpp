#include "vq/latent_quantize.h"

#include "engine/ops.h"
#include "vq/fsq.h"
#include "vq/kernels/vq_kernels.h"
#include "vq/losses.h"
#include "engine/core/count_limits.h"
#include "vq/quantizer_kind.h"

namespace vqddp {

namespace {

// Buffers named 0, 1, ...: the state names "values_per_latent.<j>" of the
// reference's ParameterList.
class BufferList : public Module {
 public:
  Tensor add(Tensor t) { return register_buffer(std::to_string(size_++), std::move(t)); }

 private:
  int size_ = 0;
};

}  // namespace

LatentQuantize::LatentQuantize(const LatentQuantizeOptions& o, Generator& init_gen) : opt_(o) {
  VQDDP_CHECK(!o.levels.empty() && o.num_codebooks >= 1, "LatentQuantize: levels must not be empty");
  const int64_t c = static_cast<int64_t>(o.levels.size());
  std::vector<int64_t> levels, basis{1};
  std::vector<float> half_width;
  auto list = register_module("values_per_latent", std::make_shared<BufferList>());
  for (int64_t j = 0; j < c; ++j) {
    const int l = o.levels[j];
    VQDDP_CHECK(l >= 2, "LatentQuantize: every level must be at least 2, got {}", l);
    std::vector<float> grid, digits;
    for (int k = 0; k < l; ++k) {
      // The reference's grid: linspace(-0.5, 0.5, L) (start + k * step) for
      // odd L, arange(L) / L - 0.5 for even L.
      grid.push_back(l % 2 == 1 ? -0.5f + static_cast<float>(k) * (1.f / static_cast<float>(l - 1))
                                : static_cast<float>(k) / static_cast<float>(l) - 0.5f);
      digits.push_back(static_cast<float>(k));
    }
    values_.push_back(list->add(from_vector(grid, {l})));
    digits_.push_back(constants_.add(from_vector(digits, {l, 1})));
    levels.push_back(l);
    half_width.push_back(static_cast<float>(l / 2));
  }
  for (int64_t j = 0; j + 1 < c; ++j) basis.push_back(basis.back() * o.levels[j]);
  codebook_size_ = fsq_codebook_size(o.levels);
  ones_ = constants_.add(full({c}, 1.0));
  levels_ = constants_.add(from_vector(levels, {c}));
  basis_ = constants_.add(from_vector(basis, {c}));
  half_width_ = constants_.add(from_vector(half_width, {c}));
  const int64_t inner = c * o.num_codebooks;
  if (o.dim == 0) opt_.dim = inner;
  projection_ = make_projection(opt_.dim, inner, init_gen);
}

QuantizerOutput LatentQuantize::quantize(const Tensor& x, Communicator& comm, const Tensor& mask) {
  refuse_mask(mask, "LatentQuantize", comm.rank());
  VQDDP_CHECK(x.defined() && x.dtype() == DType::f32 && x.dim() == 2 && x.size(1) == opt_.dim,
              "rank {}: LatentQuantize expects float32 [N, {}], got {}", comm.rank(), opt_.dim, x.desc());
  const int64_t n = x.size(0), c = static_cast<int64_t>(opt_.levels.size()), rows = n * opt_.num_codebooks;
  const Device dev = x.device();
  Tensor z = reshape(projection_.in(x), {rows, c});  // one row per codebook piece
  std::vector<Tensor> snapped, digits;
  const Tensor by_latent = transpose(z.detach());  // (C, rows)
  for (int64_t j = 0; j < c; ++j) {
    Tensor v = values_[j].to(dev);                                                    // (L)
    Tensor zj = reshape(slice_rows(by_latent, j, j + 1), {rows, 1});                  // (rows, 1)
    Tensor idx = argmin(vqddp::abs(sub(zj, reshape(v, {1, -1}))));                    // (rows)
    snapped.push_back(index_select(reshape(v, {-1, 1}), idx, Indices::trusted));      // (rows, 1)
    digits.push_back(index_select(constants_.on(digits_[j], dev), idx, Indices::trusted));
  }
  Tensor q = straight_through(z, concat(snapped, 1));  // (rows, C)
  // Index digits through FSQ's kernel: a "code" of d - 1 with half width 1
  // is digit round((d - 1) * 1 + 1) = d, exactly.
  Tensor idx = empty({rows}, DType::i64, dev);
  vq_kernels(dev).fsq_indices(sub(concat(digits, 1), 1.f), constants_.on(ones_, dev), constants_.on(basis_, dev), idx);
  QuantizerOutput out;
  out.quantized = projection_.out(reshape(q, {n, c * opt_.num_codebooks}));
  out.indices = reshape(idx, {n, opt_.num_codebooks});
  if (updates_state()) {
    out.loss = add(mul(global_mse_or_zero(x.detach(), out.quantized, comm), opt_.commitment_loss_weight),
                   mul(global_mse_or_zero(out.quantized.detach(), x, comm), opt_.quantization_loss_weight));
  } else {
    out.loss = full({}, 0.0, DType::f32, dev);
  }
  out.layer_losses = {out.loss};
  out.active_layers = opt_.num_codebooks;
  return out;
}

Tensor LatentQuantize::decode(const Tensor& indices) const {
  const int64_t nc = opt_.num_codebooks, c = static_cast<int64_t>(opt_.levels.size());
  VQDDP_CHECK(indices.dtype() == DType::i64 && indices.numel() % nc == 0,
              "LatentQuantize decode: expected int64 indices [N, {}], got {}", nc, indices.desc());
  check_index_range(indices.reshape({-1}), codebook_size_, "LatentQuantize");
  const Device dev = indices.device();
  const int64_t rows = indices.numel();
  Tensor digits = empty({rows, c}, DType::f32, dev);  // d - 1 (FSQ's code of digit d with half width 1)
  vq_kernels(dev).fsq_codes(indices.reshape({-1}), constants_.on(levels_, dev), constants_.on(ones_, dev),
                            constants_.on(basis_, dev), digits);
  const Tensor& hw = constants_.on(half_width_, dev);
  Tensor codes = div(div(sub(add(digits, 1.f), hw), hw), 2.f);  // (d - L//2) / (L//2) / 2
  return projection_.out(reshape(codes, {rows / nc, c * nc}));
}

// ---- the "latent_quantize" kind (vq/quantizer_kind.h) ----------------------------

namespace {

void read_latent_quantize(ConfigSection& s, LatentQuantizeOptions& o, int64_t) {
  read_levels(s, o.levels, "latent_quantize");
  o.num_codebooks = static_cast<int>(s.integer("num_codebooks", o.num_codebooks, limits::heads));
  o.commitment_loss_weight = static_cast<float>(s.number("commitment_loss_weight", o.commitment_loss_weight));
  o.quantization_loss_weight = static_cast<float>(s.number("quantization_loss_weight", o.quantization_loss_weight));
  if (!(o.commitment_loss_weight >= 0)) s.fail("commitment_loss_weight", "must not be negative");
  if (!(o.quantization_loss_weight >= 0)) s.fail("quantization_loss_weight", "must not be negative");
}

}  // namespace

const QuantizerKind& latent_quantize_kind() {
  static const QuantizerKind kind = [] {
    QuantizerKind k =
        make_kind<LatentQuantize, LatentQuantizeOptions>("latent_quantize", {}, read_latent_quantize);
    k.test_keys = {{"levels", {5, 4, 3}}};
    k.reference_class = "LatentQuantize";
    return k;
  }();
  return kind;
}

}  // namespace vqddp
