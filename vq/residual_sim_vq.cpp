#include "vq/residual_sim_vq.h"

#include "engine/ops.h"
#include "vq/index_columns.h"
#include "vq/residual_layers.h"
#include "engine/core/count_limits.h"
#include "vq/quantizer_kind.h"

namespace vqddp {

ResidualSimVQ::ResidualSimVQ(const ResidualSimVQOptions& o, Generator& init_gen) : opt_(o) {
  VQDDP_CHECK(o.num_quantizers >= 1, "ResidualSimVQ: num_quantizers {} must be positive", o.num_quantizers);
  auto list = register_module("layers", std::make_shared<ModuleList>());
  for (int i = 0; i < o.num_quantizers; ++i) layers_.push_back(list->append(std::make_shared<SimVQ>(o.layer, init_gen)));
  // Offsets the dropout stream id (engine/core/streams.h): never negative.
  dropout_step_ = register_buffer("dropout_step", zeros({1}, DType::i64), ValueRange::non_negative());
}

QuantizerOutput ResidualSimVQ::quantize(const Tensor& x, Communicator& comm, const Tensor& mask) {
  refuse_mask(mask, "ResidualSimVQ", comm.rank());
  VQDDP_CHECK(x.defined() && x.dim() == 2 && x.size(1) == dim(), "rank {}: ResidualSimVQ expects [N, {}], got {}",
              comm.rank(), dim(), x.desc());
  int last = last_active_layer(opt_.quantize_dropout, opt_.num_quantizers, updates_state(), opt_.seed, dropout_step_);
  return quantize_residual_layers(layers_, x, last, comm);
}

Tensor ResidualSimVQ::decode(const Tensor& indices) const {
  const int q = opt_.num_quantizers;
  VQDDP_CHECK(indices.dtype() == DType::i64 && indices.dim() == 2 && indices.size(1) == q,
              "ResidualSimVQ: expected int64 indices [N, {}], got {}", q, indices.desc());
  Tensor sum = zeros({indices.size(0), dim()}, DType::f32, indices.device());
  std::vector<Tensor> columns = split_columns(indices);
  for (int l = 0; l < q; ++l)
    sum = add(sum, codes_or_zero(columns[l], dim(), [&](const Tensor& i) { return layers_[l]->decode(i); }));
  return sum;
}

// ---- the "residual_sim_vq" kind (vq/quantizer_kind.h) ----------------------------

namespace {

void read_residual_sim_vq(ConfigSection& s, ResidualSimVQOptions& o, int64_t dim) {
  o.num_quantizers = static_cast<int>(s.integer("num_quantizers", o.num_quantizers, limits::layers));
  read_quantize_dropout(s, o.quantize_dropout, o.num_quantizers);
  read_sim_vq_keys(s, o.layer, dim, o.num_quantizers);
}

}  // namespace

const QuantizerKind& residual_sim_vq_kind() {
  static const QuantizerKind kind = [] {
    ResidualSimVQOptions defaults;
    defaults.layer.codebook_size = 256;
    QuantizerKind k =
        make_kind<ResidualSimVQ, ResidualSimVQOptions>("residual_sim_vq", defaults, read_residual_sim_vq);
    k.residual = true;
    k.test_keys = {{"codebook_size", 16}, {"num_quantizers", 3}, {"quantize_dropout", true}};
    k.reference_class = "ResidualSimVQ";
    return k;
  }();
  return kind;
}

}  // namespace vqddp
