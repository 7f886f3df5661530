#include "vq/quantizer.h"

#include <cmath>

#include "engine/core/error.h"
#include "engine/ops.h"

namespace vqddp {

Tensor Projection::in(const Tensor& x) const {
  if (!in_) return x;
  Tensor y = in_->forward(x);
  return norm_ ? norm_->forward(y) : y;
}
Tensor Projection::out(const Tensor& y) const { return out_ ? out_->forward(y) : y; }

const Tensor& QuantizerOutput::extra(const std::string& name) const {
  auto it = extras.find(name);
  VQDDP_CHECK(it != extras.end(), "quantizer output has no scalar '{}'", name);
  return it->second;
}

double Quantizer::bits() const {
  double b = 0;
  for (int64_t k : layer_sizes()) b += std::log2(static_cast<double>(k));
  return b;
}

Projection Quantizer::make_projection(int64_t dim, int64_t inner, Generator& init_gen, bool layernorm) {
  Projection p;
  if (dim != inner) {
    // project_in first: the order the generator's draws have always had.
    p.in_ = register_module("project_in", std::make_shared<Linear>(dim, inner, init_gen));
    p.out_ = register_module("project_out", std::make_shared<Linear>(inner, dim, init_gen));
    if (layernorm) p.norm_ = register_module("project_in_norm", std::make_shared<LayerNorm>(inner));
  }
  return p;
}

void Quantizer::refuse_mask(const Tensor& mask, const char* who, int rank) {
  VQDDP_CHECK(!mask.defined(), "rank {}: {} takes no mask (only codebook quantizers skip masked rows)", rank, who);
}

Tensor Quantizer::as_columns(const Tensor& indices) {
  return indices.dim() == 1 ? reshape(indices, {-1, 1}) : indices;
}

QuantizerOutput Quantizer::without_loss(const Tensor& quantized, const Tensor& indices, int active_layers) {
  QuantizerOutput out;
  out.quantized = quantized;
  out.indices = as_columns(indices);
  out.loss = full({}, 0.0, DType::f32, quantized.device());
  out.active_layers = active_layers;
  return out;
}

}  // namespace vqddp
