// The residual loop shared by the residual quantizers whose layers are
// whole quantizers (ResidualLFQ, ResidualSimVQ): layer l quantizes what the
// layers before it left, for l up to `last` (quantize dropout's last active
// layer; later layers get index -1 and a zero loss).
//
//   residual = z; for l <= last: q_l = layer_l(residual),
//   residual -= q_l.detach(), out += q_l
//
// Returns the contract's output for z: quantized (the sum, before any
// projection), indices (N, Q), layer_losses (Q) and their sum,
// active_layers = last + 1. Every layer's DDP rule holds unchanged: every
// rank runs the same layers (the same `last`).
// Internal header: not installed with the library (the residual quantizers' shared loop).
#pragma once

#include <memory>
#include <vector>

#include "vq/quantizer.h"

namespace vqddp {

QuantizerOutput quantize_residual_layers(const std::vector<Quantizer*>& layers, const Tensor& z, int last,
                                         Communicator& comm);

// The same for a module's layer list.
template <class Layer>
QuantizerOutput quantize_residual_layers(const std::vector<std::shared_ptr<Layer>>& layers, const Tensor& z, int last,
                                         Communicator& comm) {
  std::vector<Quantizer*> raw;
  for (const auto& l : layers) raw.push_back(l.get());
  return quantize_residual_layers(raw, z, last, comm);
}

}  // namespace vqddp
