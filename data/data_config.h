// What a config's "data" section says (train/config.h reads it): the data
// set's type, its sources and how they are cut into examples. Here, beside
// the readers that use it, so data/ depends on engine/ alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vqddp {

struct DataSourceConfig {
  std::string path;  // audio (data/audio_index.h): a directory, a list or a JSONL manifest; or an IDX file
  double weight = 1;
  // wav_frames: the command that makes the directory (a shipped example's
  // `vqddp convert ...`), shown when the directory does not exist yet.
  std::string made_by;
  bool operator==(const DataSourceConfig&) const = default;
};

struct DataConfig {
  std::string type = "wav_frames";  // wav_frames, fashion_mnist
  std::vector<DataSourceConfig> sources;
  int64_t frame = 80;            // wav_frames: samples per example
  int64_t max_files = 0;         // wav_frames: per source, 0 = all
  int64_t sample_rate = 0;       // wav_frames: Hz every clip is resampled to; 0: the first clip's, mixed rates refused
  int64_t holdout_every = 10;    // wav_frames: every k-th clip is held out for validation
  std::string validation_path;   // fashion_mnist: IDX images for validation
  int64_t max_examples = 0;      // per source, 0 = all
  std::string index_dir;         // wav_frames: where the header index is cached ("" default, "off": nowhere)
  int64_t readers = 1;           // reader threads per rank (train/batch_prefetch.h)
  int64_t prefetch = 4;          // steps each rank reads ahead (0: each batch read when its step starts)
  std::string bad_files = "error";  // wav_frames: a row that cannot be read stops the run, or is skipped ("skip")
  bool operator==(const DataConfig&) const = default;
};

}  // namespace vqddp
