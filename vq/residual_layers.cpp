#include "vq/residual_layers.h"

#include "engine/ops.h"
#include "vq/index_columns.h"

namespace vqddp {

QuantizerOutput quantize_residual_layers(const std::vector<Quantizer*>& layers, const Tensor& z, int last,
                                         Communicator& comm) {
  const int q = static_cast<int>(layers.size());
  const int64_t n = z.size(0);
  const Device dev = z.device();
  QuantizerOutput out;
  out.active_layers = last + 1;
  const Tensor zero = full({}, 0.0, DType::f32, dev);  // the loss of a layer that did not run
  Tensor residual = z, sum = zeros({n, z.size(1)}, DType::f32, dev);
  std::vector<Tensor> idx_columns(q, full({n}, -1, DType::i64, dev));  // -1: layer dropped
  out.loss = zero;
  for (int l = 0; l < q; ++l) {
    if (l > last) {
      out.layer_losses.push_back(zero);
      continue;
    }
    QuantizerOutput o = layers[l]->quantize(residual, comm);
    residual = sub(residual, o.quantized.detach());
    sum = add(sum, o.quantized);
    idx_columns[l] = reshape(o.indices, {-1});
    out.layer_losses.push_back(o.loss);
    out.loss = add(out.loss, o.loss);
  }
  out.quantized = sum;
  out.indices = stack_columns(idx_columns);
  return out;
}

}  // namespace vqddp
