// Training and validation examples as rows (data/example_source.h).
//
//   wav_frames:    each source is a directory of audio clips of any format
//                  libsndfile reads (data/audio.h; sorted by name, not
//                  recursive), mono by the channels' mean, at
//                  data.sample_rate or the first clip's rate; every holdout_every-th
//                  clip is held out for validation; clips are cut into
//                  non-overlapping frames of `frame` samples (the tail is
//                  dropped). Only the clips' headers are read to plan the
//                  run: each row is decoded when it is asked for
//                  (data/audio_windows.h), so memory does not grow with
//                  the corpus.
//   fashion_mnist: each source is an IDX image file (gzip); pixels / 255;
//                  validation images from data.validation_path; in memory.
#pragma once

#include <string>
#include <vector>

#include "data/example_source.h"
#include "engine/core/tensor.h"
#include "data/data_config.h"

namespace vqddp {

struct Dataset {
  std::vector<DataRows> sources;  // (M_i, F) training examples of each source
  std::vector<double> weights;    // sampling weight of each source
  DataRows validation;            // (V, F)
  int64_t example_dim = 0;      // F
  double examples_per_second = 0;  // audio frames per second (0 for images)
  int64_t sample_rate = 0;         // Hz of every clip (0 for images)
  std::string description;
  // data.bad_files "skip": a row that cannot be read (its file gone,
  // changed or cut short) is replaced by the next row of its source that
  // can be (train/batch_prefetch.h), instead of stopping the run.
  bool skip_bad_rows = false;
  // data.readers and data.prefetch: how each rank reads ahead.
  int readers = 1, prefetch = 4;
};

Dataset load_dataset(const DataConfig& config);

// A CRC32C (engine/core/file_io.h) of what training reads: every source's
// fingerprint (ExampleSource::fingerprint: rows, width, and the content or,
// for audio, each clip's header facts, size and first and last bytes), in
// order, and the validation set's. Ranks compare it before the first step
// (agree_schedule), so ranks that see different data (another file on one
// node, a source missing, the same total split otherwise) stop with an
// error instead of shuffling differently. Paths are not part of it.
uint32_t data_fingerprint(const Dataset& data);

// The paths of the clips a wav_frames config holds out for validation
// (holdout_every), in validation's order: what `vqddp eval --held-out`
// scores. Empty for other data types.
std::vector<std::string> held_out_clips(const Dataset& data);

}  // namespace vqddp
