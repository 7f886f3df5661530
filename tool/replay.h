// `vqddp replay`: runs recorded batches through a quantizer in training mode
// on W thread ranks and writes each step's outputs, gradients and state, to
// hold a vector-quantize-pytorch module against ours (its class, keys and
// state_dict names: tool/reference_quantizer.h) or to step one bare EMA
// codebook (the file formats are in docs/vq.md, "replay").
#pragma once

#include <string>
#include <vector>

#include "engine/core/safetensors.h"
#include "vq/codebook.h"

namespace vqddp {

struct ReplayOptions {
  std::string input;
  std::string output;
  int world = 1;
  // Rows per rank for every batch ("3,0,5"), or per batch separated by ';'.
  // Empty: W contiguous shards as even as possible, the extra rows on the
  // first ranks.
  std::string shards;
};

// Returns the number of batches replayed. Errors name the file and the key or
// tensor at fault; the output is written atomically, only on success.
int run_replay(const ReplayOptions& options);

// The codebook options a replay file's metadata sets, read by the config's
// reader of those keys (vq/quantizer_options.h), and its commitment weight.
// Errors name `file`.
CodebookOptions replay_codebook_options(const SafetensorsFile& f, const std::string& file, float& commitment_weight);

}  // namespace vqddp
