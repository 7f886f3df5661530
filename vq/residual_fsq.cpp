#include "vq/residual_fsq.h"

#include <cmath>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "vq/finite_rows.h"
#include "vq/index_columns.h"
#include "engine/core/count_limits.h"
#include "vq/quantizer_kind.h"

namespace vqddp {

ResidualFSQ::ResidualFSQ(const ResidualFSQOptions& o, Generator& init_gen) : opt_(o) {
  VQDDP_CHECK(o.num_quantizers >= 1, "ResidualFSQ: num_quantizers {} must be positive", o.num_quantizers);
  FSQOptions layer{o.levels, 0, 1};
  layer.preserve_symmetry = true;
  layer.bound_hard_clamp = true;
  fsq_ = std::make_shared<FSQ>(layer, init_gen);
  code_dim_ = fsq_->code_dim();
  if (opt_.dim == 0) opt_.dim = code_dim_;
  projection_ = make_projection(opt_.dim, code_dim_, init_gen);
  std::vector<float> c;
  for (int l : o.levels) c.push_back(1.f + 1.f / static_cast<float>(l - 1));
  soft_clamp_ = constants_.add(from_vector(c, {code_dim_}));
  for (int i = 0; i < o.num_quantizers; ++i) {
    std::vector<float> s;
    for (int l : o.levels) s.push_back(static_cast<float>(std::pow(double(l), -double(i))));
    scales_.add(from_vector(s, {code_dim_}));
  }
  // Offsets the dropout stream id (engine/core/streams.h): never negative.
  dropout_step_ = register_buffer("dropout_step", zeros({1}, DType::i64), ValueRange::non_negative());
}

Tensor ResidualFSQ::decode(const Tensor& indices) const {
  const int q = opt_.num_quantizers;
  VQDDP_CHECK(indices.dtype() == DType::i64 && indices.dim() == 2 && indices.size(1) == q,
              "ResidualFSQ: expected int64 indices [N, {}], got {}", q, indices.desc());
  int64_t n = indices.size(0);
  Device dev = indices.device();
  Tensor sum = zeros({n, code_dim_}, DType::f32, dev);
  std::vector<Tensor> layers = split_columns(indices);
  for (int l = 0; l < q; ++l)
    sum = add(sum, codes_or_zero(layers[l], code_dim_,
                                 [&](const Tensor& i) { return mul(fsq_->indices_to_codes(i), scales_.on(l, dev)); }));
  return projection_.out(sum);
}

QuantizerOutput ResidualFSQ::quantize(const Tensor& x, Communicator& comm, const Tensor& mask) {
  refuse_mask(mask, "ResidualFSQ", comm.rank());
  // As FSQ::quantize: alike on every rank in a training step, locally in
  // inference.
  VQDDP_CHECK(x.defined() && x.dim() == 2 && x.size(1) == opt_.dim, "rank {}: ResidualFSQ expects [N, {}], got {}",
              comm.rank(), opt_.dim, x.desc());
  if (updates_state()) refuse_nonfinite_rows(x, comm, "ResidualFSQ's input");
  const int q = opt_.num_quantizers;
  Tensor z = projection_.in(x);  // (N, D)
  {
    const Tensor& c = constants_.on(soft_clamp_, z.device());
    z = mul(vqddp::tanh(div(z, c)), c);
  }
  int64_t n = z.size(0);
  int last = last_active_layer(opt_.quantize_dropout, q, updates_state(), opt_.seed, dropout_step_);
  Device dev = z.device();
  Tensor residual = z, sum = zeros({n, code_dim_}, DType::f32, dev);
  std::vector<Tensor> idx_columns(q, full({n}, -1, DType::i64, dev));  // -1: layer dropped
  for (int l = 0; l <= last; ++l) {
    const Tensor& scale = scales_.on(l, dev);
    Tensor scaled = div(residual, scale);
    Tensor code = fsq_->round_codes(scaled);                // (N, D)
    Tensor layer_idx = fsq_->codes_to_indices(code);
    Tensor quantized = mul(code, scale);
    residual = sub(residual, quantized.detach());
    sum = add(sum, quantized);
    idx_columns[l] = layer_idx;
  }
  return without_loss(projection_.out(sum), stack_columns(idx_columns), last + 1);
}

// ---- the "residual_fsq" kind (vq/quantizer_kind.h) -------------------------------

namespace {

void read_residual_fsq(ConfigSection& s, ResidualFSQOptions& o, int64_t) {
  o.num_quantizers = static_cast<int>(s.integer("num_quantizers", o.num_quantizers, limits::layers));
  read_quantize_dropout(s, o.quantize_dropout, o.num_quantizers);
  read_levels(s, o.levels, "residual_fsq");
}

}  // namespace

const QuantizerKind& residual_fsq_kind() {
  static const QuantizerKind kind = [] {
    QuantizerKind k = make_kind<ResidualFSQ, ResidualFSQOptions>("residual_fsq", {}, read_residual_fsq);
    k.residual = true;
    k.test_keys = {{"levels", {5, 4, 3}}, {"num_quantizers", 3}, {"quantize_dropout", true}};
    k.reference_class = "ResidualFSQ";
    return k;
  }();
  return kind;
}

}  // namespace vqddp
