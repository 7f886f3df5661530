#include "vq/residual_lfq.h"

#include <cmath>

#include "engine/ops.h"
#include "vq/index_columns.h"
#include "vq/residual_layers.h"
#include "engine/core/count_limits.h"
#include "vq/quantizer_kind.h"

namespace vqddp {

ResidualLFQ::ResidualLFQ(const ResidualLFQOptions& o, Generator& init_gen) : opt_(o) {
  VQDDP_CHECK(o.num_quantizers >= 1, "ResidualLFQ: num_quantizers {} must be positive", o.num_quantizers);
  for (int i = 0; i < o.num_quantizers; ++i) {
    LFQOptions l = o.lfq;
    l.codebook_size = o.codebook_size;
    l.dim = 0;  // the layers work in the projected space: no projection of their own
    l.codebook_scale = static_cast<float>(std::ldexp(static_cast<double>(o.lfq.codebook_scale), -i));
    layers_.push_back(std::make_shared<LFQ>(l, init_gen));  // LFQ checks codebook_size
  }
  bits_ = layers_[0]->code_bits();
  if (opt_.dim == 0) opt_.dim = bits_;
  projection_ = make_projection(opt_.dim, bits_, init_gen);
  // Registered after the projection: layers hold no tensors, only their
  // train/eval mode follows this module's.
  for (int i = 0; i < o.num_quantizers; ++i) register_module("layer" + std::to_string(i), layers_[i]);
  // Offsets the dropout stream id (engine/core/streams.h): never negative.
  dropout_step_ = register_buffer("dropout_step", zeros({1}, DType::i64), ValueRange::non_negative());
}

QuantizerOutput ResidualLFQ::quantize(const Tensor& x, Communicator& comm, const Tensor& mask) {
  refuse_mask(mask, "ResidualLFQ", comm.rank());
  VQDDP_CHECK(x.defined() && x.dim() == 2 && x.size(1) == opt_.dim, "rank {}: ResidualLFQ expects [N, {}], got {}",
              comm.rank(), opt_.dim, x.desc());
  Tensor z = projection_.in(x);  // (N, B)
  int last = last_active_layer(opt_.quantize_dropout, opt_.num_quantizers, updates_state(), opt_.seed, dropout_step_);
  QuantizerOutput out = quantize_residual_layers(layers_, z, last, comm);
  out.quantized = projection_.out(out.quantized);
  return out;
}

Tensor ResidualLFQ::decode(const Tensor& indices) const {
  const int q = opt_.num_quantizers;
  VQDDP_CHECK(indices.dtype() == DType::i64 && indices.dim() == 2 && indices.size(1) == q,
              "ResidualLFQ: expected int64 indices [N, {}], got {}", q, indices.desc());
  Tensor sum = zeros({indices.size(0), bits_}, DType::f32, indices.device());
  std::vector<Tensor> columns = split_columns(indices);
  for (int l = 0; l < q; ++l)
    sum = add(sum, codes_or_zero(columns[l], bits_, [&](const Tensor& i) { return layers_[l]->decode(i); }));
  return projection_.out(sum);
}

// ---- the "residual_lfq" kind (vq/quantizer_kind.h) -------------------------------

namespace {

void read_residual_lfq(ConfigSection& s, ResidualLFQOptions& o, int64_t) {
  o.codebook_size = s.integer("codebook_size", o.codebook_size, limits::codebook_size);
  o.num_quantizers = static_cast<int>(s.integer("num_quantizers", o.num_quantizers, limits::layers));
  read_quantize_dropout(s, o.quantize_dropout, o.num_quantizers);
  o.lfq.codebook_size = o.codebook_size;
  read_lfq_keys(s, o.lfq, "residual_lfq");
}

}  // namespace

const QuantizerKind& residual_lfq_kind() {
  static const QuantizerKind kind = [] {
    ResidualLFQOptions defaults;
    defaults.codebook_size = defaults.lfq.codebook_size = 256;
    QuantizerKind k = make_kind<ResidualLFQ, ResidualLFQOptions>("residual_lfq", defaults, read_residual_lfq);
    k.residual = true;
    k.test_keys = {{"codebook_size", 16}, {"num_quantizers", 3}, {"quantize_dropout", true}};
    k.reference_class = "ResidualLFQ";
    k.reference_defaults = [](QuantizerOptions& q, int64_t) { lfq_reference_defaults(q.as<ResidualLFQOptions>().lfq); };
    k.reference_constant = is_lfq_constant;
    return k;
  }();
  return kind;
}

}  // namespace vqddp
