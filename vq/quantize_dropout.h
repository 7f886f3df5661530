// Quantize dropout for residual quantizers (docs/design.md section 5).
//
// In a training step with dropout on, layers after a random index q in
// [cutoff, Q-1] are skipped: index -1, no loss, no codebook update, no
// collective. Every rank must pick the same q or ranks would run different
// numbers of collectives (a hang, or the [9330, 512] vs [9331, 512] shape
// mismatch). q comes from a SHARED counter-based stream keyed by the seed
// and a step counter that is part of the module's state and advances on
// every rank alike: no collective at all, so nothing to hang when only some
// ranks run a pass. Inference (eval, or no-grad) never drops and does not
// advance the counter.
#pragma once

#include <optional>

#include "engine/core/random.h"
#include "engine/core/tensor.h"

namespace vqddp {

struct QuantizeDropoutOptions {
  bool enabled = false;
  int cutoff_index = 0;  // layers 0..cutoff always run
  int multiple_of = 1;   // round the number of active layers up to a multiple of this
  // The shared stream's key; unset: the module's seed. The grouped
  // quantizers give every group one key, so all groups drop the same layers
  // in a step (as vector-quantize-pytorch's grouped forms share one seed).
  std::optional<uint64_t> seed;
  bool operator==(const QuantizeDropoutOptions&) const = default;
};

// The last active layer for this step, drawn from the shared stream
// (opt.seed or else seed, step) and advancing `step` (int64 (1)); Q - 1 when dropout is off or
// not in update mode (then `step` is left alone).
int last_active_layer(const QuantizeDropoutOptions& opt, int num_layers, bool update_mode, uint64_t seed, Tensor& step);

}  // namespace vqddp
