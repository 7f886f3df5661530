// vector-quantize-pytorch's view of our quantizers, for `vqddp replay`: its
// class names, its constructor defaults, and the names and layouts its
// state_dict() gives the state we hold, so a file written from a PyTorch
// module runs here and ours reads back into it (docs/vq.md, "replay").
#pragma once

#include <map>
#include <string>
#include <vector>

#include "engine/nn.h"
#include "engine/core/safetensors.h"
#include "vq/quantizer_kind.h"
#include "vq/quantizer_options.h"

namespace vqddp {

// A quantizer described by the reference's keys: the metadata's "class"
// (VectorQuantize, ResidualVQ, FSQ, ...: each kind's reference_class), "dim"
// and the constructor's other keyword arguments, each a string holding a
// JSON value.
struct ReferenceQuantizer {
  std::string class_name;
  QuantizerOptions options;  // our type; keys absent from the metadata at the REFERENCE's defaults
  int64_t dim = 0;           // the input width ("dim"; FSQ, LFQ: the reference's default when absent)
  uint64_t seed = 0;         // ours ("seed"): keys k-means, revival and dropout draws
};

// The class names `replay` knows, in the registry's order.
const std::vector<std::string>& reference_classes();

// Reads the metadata: the class and its keys, checked by the reader of a
// config's quantizer section (unknown keys are errors naming `file`).
ReferenceQuantizer reference_quantizer(const std::map<std::string, std::string>& metadata, const std::string& file);

// The slots of every state tensor of `m` (made from `q`), in state order;
// a shared codebook gives one slot per layer the reference names it under.
std::vector<ReferenceSlot> reference_slots(const QuantizerOptions& q, const Module& m);

// Sets m's state from the reference-named tensors of `f`. Every slot but
// ours_only must be present with the reference's shape; copies of one
// shared tensor must agree. Returns the names it read, so the caller can
// refuse the rest; the reference's constant buffers (LFQ's `mask`) are
// accepted and not read.
std::vector<std::string> load_reference_state(Module& m, const std::vector<ReferenceSlot>& slots,
                                              const SafetensorsFile& f);

// True for a constant buffer of the reference that holds no state of ours.
bool is_reference_constant(const QuantizerOptions& q, const std::string& name);

// Those of `tensors` (ours, by name: state or gradients) that have a slot,
// under the reference's names and layouts (copies).
NamedTensors to_reference(const NamedTensors& tensors, const std::vector<ReferenceSlot>& slots);

// m's state under the reference's names and layouts (host copies).
NamedTensors reference_state(const Module& m, const std::vector<ReferenceSlot>& slots);

}  // namespace vqddp
