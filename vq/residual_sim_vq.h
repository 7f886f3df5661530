// ResidualSimVQ: SimVQ layers on the residual (vector-quantize-pytorch's
// ResidualSimVQ).
//
//   for layer i (0..Q-1, up to the quantize dropout's last layer):
//     q_i = SimVQ_i(residual)       each layer its own frozen codebook and map
//     residual -= q_i.detach(); out += q_i
//   loss = sum of the layers' SimVQ losses (0 for a dropped layer)
//
// No projection (the reference has none). The dropout index comes from the
// shared stream (vq/quantize_dropout.h): every rank runs the same layers.
// State: layers.<i>.frozen_codebook, layers.<i>.code_transform.weight (the
// reference's names), dropout_step.
#pragma once

#include <memory>
#include <vector>

#include "vq/quantize_dropout.h"
#include "vq/quantizer.h"
#include "vq/sim_vq.h"

namespace vqddp {

struct ResidualSimVQOptions {
  SimVQOptions layer;  // each layer's (dim, codebook_size, ... as SimVQ)
  int num_quantizers = 4;
  QuantizeDropoutOptions quantize_dropout;
  uint64_t seed = 0;  // keys the dropout stream
  bool operator==(const ResidualSimVQOptions&) const = default;
};

class ResidualSimVQ : public Quantizer {
 public:
  ResidualSimVQ(const ResidualSimVQOptions& options, Generator& init_gen);

  // The contract (vq/quantizer.h): indices (N, Q), -1 for dropped layers;
  // layer_losses per layer; no metrics; takes no mask.
  QuantizerOutput quantize(const Tensor& x, Communicator& comm, const Tensor& mask = Tensor()) override;
  Tensor decode(const Tensor& indices) const override;
  std::vector<int64_t> layer_sizes() const override {
    return std::vector<int64_t>(opt_.num_quantizers, opt_.layer.codebook_size);
  }
  int64_t dim() const override { return opt_.layer.dim; }
  const SimVQ& layer(int i) const { return *layers_.at(i); }

 private:
  ResidualSimVQOptions opt_;
  std::vector<std::shared_ptr<SimVQ>> layers_;
  Tensor dropout_step_;  // int64 (1): training steps drawn so far (the dropout stream)
};

}  // namespace vqddp
