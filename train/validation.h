// Validation: the codec on the held-out set, in eval mode under no-grad,
// its measures the same numbers on any number of ranks.
//
// Internal header: not installed with the library (the trainer's validation).
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "data/dataset.h"
#include "train/model.h"
#include "train/trainer.h"

namespace vqddp {

struct Validation {
  double mse = 0, snr_db = 0;
  double log_mel = -1;  // log-mel L1 distance (audio; -1 for images)
  double stft_distance = -1;  // multi-resolution STFT distance (audio; -1 for images)
  double stoi = -1;  // STOI (train/stoi.h), the mean over chunks long enough for it (audio; -1 for images or none)
  int64_t skipped = 0;  // held-out rows passed over (data.bad_files "skip"), all ranks
  std::vector<LayerUsage> usage;
  std::vector<float> histogram;  // every layer's code counts, layer after layer
};

// Collective: every rank calls it at the same step (`done`, for messages).
// Eval mode, no grad: no module issues a collective; one all_reduce agrees
// that every rank's chunks went well (comm/agree.h), one reduce_units sums
// them, one all_reduce the code counts. The validation set is cut into
// chunks of about 2^16 input floats fixed by position, each rank taking
// whole chunks: a rank's memory is bounded by a chunk's, whatever the
// held-out set's size. A chunk's sums (and its log-mel windows, over its
// frames laid end to end) depend on its examples alone, and the chunks'
// sums are added in chunk order, so every number is the same on any number
// of ranks. The model is back in training mode on return.
Validation validate(CodecModel& model, const Dataset& data, Communicator& comm, Device device, int64_t done);

// Per-layer usage (perplexity, codes used) of code histograms laid layer
// after layer (sizes[l] counts each).
std::vector<LayerUsage> usage_of(const float* histogram, const std::vector<int64_t>& sizes);

}  // namespace vqddp
