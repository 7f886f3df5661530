// The Quantizer contract: the one shape every quantizer has, so a model, the
// trainer, `replay` and embedding users hold "a quantizer" and never
// dispatch on its kind. The kinds are listed in vq/quantizer_registry.h
// (each type's class, options, reader and factory in its own files);
// make_quantizer in vq/quantizer_options.h makes one from options.
//
//   quantize(x (N, dim), comm, mask) -> QuantizerOutput
//     quantized (N, dim)   straight-through, the input's rows in order
//     indices   (N, Q)     int64, one column per index layer (residual
//                          layers, heads, FSQ codebooks); -1 where a layer
//                          did not run (quantize dropout) or a row is masked
//     loss                 scalar, the sum of layer_losses (0 for FSQ)
//     layer_losses         Q scalars (empty where the quantizer has none)
//     metrics              per codebook, global counts (empty for FSQ/LFQ:
//                          they have no codebook statistics to count)
//     active_layers        layers that ran this step (Q without dropout)
//     extras               per-type named scalars (loss terms, logged
//                          statistics), e.g. LFQ's "entropy_loss"; see each
//                          type's header for its names
//   decode(indices (N, Q)) -> (N, dim): the eval output; no collective
//   layer_sizes()          codes per index column (Q entries)
//   bits()                 sum of log2(layer size): bits per input row
//
// quantize() is every quantizer's one forward: there is no second entry
// with other fields. Its DDP rule: in a training step (training mode, grad
// on) every rank calls, also with N = 0; inference issues no collective.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "engine/nn.h"
#include "vq/codebook.h"

namespace vqddp {

struct QuantizerOutput {
  Tensor quantized;                      // (N, dim)
  Tensor indices;                        // (N, Q) int64
  Tensor loss;                           // scalar
  std::vector<Tensor> layer_losses;      // per layer, where the quantizer has layer losses
  std::vector<CodebookMetrics> metrics;  // per codebook (one entry for a shared codebook)
  int active_layers = 0;
  std::map<std::string, Tensor> extras;  // per type, named in its header

  // extras.at(name), with an error naming the missing scalar.
  const Tensor& extra(const std::string& name) const;
};

// project_in (dim -> inner) and project_out (inner -> dim), both present
// exactly when dim != inner. Registered on the quantizer that owns them as
// "project_in" / "project_out" (checkpoint names), drawing their initial
// weights from the quantizer's init generator at the point it is made.
class Projection {
 public:
  Tensor in(const Tensor& x) const;   // x, or project_in(x) (then its LayerNorm, when it has one)
  Tensor out(const Tensor& y) const;  // y, or project_out(y)
  bool active() const { return in_ != nullptr; }

 private:
  friend class Quantizer;
  std::shared_ptr<Linear> in_, out_;
  std::shared_ptr<LayerNorm> norm_;  // layernorm_after_project_in
};

class Quantizer : public Module {
 public:
  // Masks: undefined, or int64 (N) with 1 = keep. Codebook quantizers drop
  // masked rows from every statistic; FSQ, LFQ and their residual forms
  // refuse a mask (their training has no per-row state to protect).
  virtual QuantizerOutput quantize(const Tensor& x, Communicator& comm, const Tensor& mask = Tensor()) = 0;
  virtual Tensor decode(const Tensor& indices) const = 0;
  virtual std::vector<int64_t> layer_sizes() const = 0;
  // The input width (options' dim, resolved).
  virtual int64_t dim() const = 0;
  int num_layers() const { return static_cast<int>(layer_sizes().size()); }
  double bits() const;

 protected:
  // Registers project_in / project_out on this module when dim != inner,
  // and with `layernorm` a LayerNorm(inner) after project_in
  // ("project_in_norm"; vector-quantize-pytorch's layernorm_after_project_in,
  // which exists only with a projection there too).
  Projection make_projection(int64_t dim, int64_t inner, Generator& init_gen, bool layernorm = false);
  // Refuses a mask for quantizers that take none (naming `who` and the rank).
  static void refuse_mask(const Tensor& mask, const char* who, int rank);
  // indices (N) -> (N, 1); (N, Q) unchanged.
  static Tensor as_columns(const Tensor& indices);
  // The output of a quantizer with no loss and no codebook statistics (FSQ):
  // a zero loss on the output's device, no layer losses, no metrics.
  static QuantizerOutput without_loss(const Tensor& quantized, const Tensor& indices, int active_layers);
};

}  // namespace vqddp
