// ResidualLFQ: lookup-free quantizers on the residual (as
// vector-quantize-pytorch's ResidualLFQ).
//
//   z = project_in(x)                  (N, B), B = log2(codebook_size)
//   for layer i (0..Q-1, up to the quantize dropout's last layer):
//     q_i = LFQ_i(residual)            codes +-2^-i (codebook_scale halves
//                                      per layer: each layer refines the last)
//     residual -= q_i.detach(); out += q_i
//   output = project_out(out); loss = sum of the layers' LFQ losses
//
// Each layer is an LFQ with its own entropy all-reduce, so in training every
// rank runs the same layers: the dropout index comes from the shared stream
// (vq/quantize_dropout.h), never from a rank's own draw.
#pragma once

#include <memory>
#include <vector>

#include "vq/lfq.h"
#include "vq/quantize_dropout.h"
#include "vq/quantizer.h"

namespace vqddp {

struct ResidualLFQOptions {
  int64_t dim = 0;  // 0: log2(codebook_size) (no projection)
  int num_quantizers = 4;
  int64_t codebook_size = 1024;  // per layer; a power of two (LFQOptions)
  // The per-layer LFQ hyper-parameters (entropy and commitment weights,
  // diversity_gamma, inv_temperature); dim and codebook_scale are set per
  // layer (layer i: codebook_scale * 2^-i).
  LFQOptions lfq;
  QuantizeDropoutOptions quantize_dropout;
  uint64_t seed = 0;
  bool operator==(const ResidualLFQOptions&) const = default;
};

class ResidualLFQ : public Quantizer {
 public:
  ResidualLFQ(const ResidualLFQOptions& options, Generator& init_gen);

  // indices (N, Q), -1 for dropped layers; layer_losses per layer (0 when
  // dropped). Every rank must call in training and run backward.
  QuantizerOutput quantize(const Tensor& x, Communicator& comm, const Tensor& mask = Tensor()) override;
  Tensor decode(const Tensor& indices) const override;
  std::vector<int64_t> layer_sizes() const override {
    return std::vector<int64_t>(opt_.num_quantizers, opt_.codebook_size);
  }
  int64_t dim() const override { return opt_.dim; }
  const LFQ& layer(int i) const { return *layers_.at(i); }

 private:
  ResidualLFQOptions opt_;
  int64_t bits_ = 0;
  Projection projection_;
  std::vector<std::shared_ptr<LFQ>> layers_;
  Tensor dropout_step_;  // int64 (1): training steps drawn so far (the dropout stream)
};

}  // namespace vqddp
