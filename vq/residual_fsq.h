// ResidualFSQ: Q FSQ layers on successive residuals, layer i working at
// scale L^-i (per dimension): q_i = FSQ(residual / s_i) * s_i with
// s_i = L^-i, as docs/design.md section 2 states. As vector-quantize-
// pytorch's: the layers are symmetric FSQ with a hard clamp (vq/fsq.h:
// L codes over [-1, 1], ends included, so a layer's grid covers the
// previous layer's bin), and the projected input is soft-clamped once,
// z = tanh(z / c) * c with c = 1 + 1/(L - 1) per dimension. Quantize dropout as in
// ResidualVQ (vq/quantize_dropout.h). No codebook statistics; the dropout
// index comes from a shared stream. quantize()'s one collective: it refuses non-finite input on every rank alike,
// with one all-reduce of W flags when the input is on the host, in a
// training step; inference issues no collective (vq/finite_rows.h).
#pragma once

#include <memory>

#include "vq/device_constants.h"
#include "vq/fsq.h"
#include "vq/quantize_dropout.h"
#include "vq/quantizer.h"

namespace vqddp {

struct ResidualFSQOptions {
  std::vector<int> levels;
  int num_quantizers = 4;
  int64_t dim = 0;  // 0: levels.size() (no projection)
  QuantizeDropoutOptions quantize_dropout;
  uint64_t seed = 0;
  bool operator==(const ResidualFSQOptions&) const = default;
};

class ResidualFSQ : public Quantizer {
 public:
  ResidualFSQ(const ResidualFSQOptions& options, Generator& init_gen);

  Tensor decode(const Tensor& indices) const override;
  // The contract (vq/quantizer.h): indices (N, Q), -1 for dropped layers; a
  // zero loss, no metrics, takes no mask. A training step (training mode,
  // grad on) draws the dropout index; otherwise all layers run.
  // In a training step every rank must call: for host input it
  // all-reduces the ranks' non-finite flags (vq/finite_rows.h).
  QuantizerOutput quantize(const Tensor& x, Communicator& comm, const Tensor& mask = Tensor()) override;
  std::vector<int64_t> layer_sizes() const override {
    return std::vector<int64_t>(opt_.num_quantizers, fsq_->codebook_size());
  }
  int64_t dim() const override { return opt_.dim; }

 private:
  ResidualFSQOptions opt_;
  int64_t code_dim_;
  std::shared_ptr<FSQ> fsq_;  // the per-layer quantizer (no state, no projection)
  DeviceConstants scales_;  // (D) per layer: L^-i, uploaded once per device
  DeviceConstants constants_;  // (D): the soft clamp's c = 1 + 1/(L - 1)
  size_t soft_clamp_ = 0;
  Projection projection_;
  Tensor dropout_step_;  // int64 (1)
};

}  // namespace vqddp
