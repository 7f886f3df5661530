// A data source of audio windows read on demand: row r is a window of
// `frame` consecutive samples of one clip at the data set's rate, the
// clips' non-overlapping windows laid end to end in clip order (each clip's
// tail shorter than a window dropped). Built from the clips' headers alone
// (no sample is decoded to plan a run); each read decodes one window from
// its file (data/audio.h read_audio_window), so memory does not depend on
// the corpus's size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/example_source.h"

namespace vqddp {

// What a clip's header and file say, read once when the source is built.
struct AudioClip {
  std::string path;
  int file_rate = 0, channels = 0;
  int64_t frames = 0;    // as stored, at file_rate
  int64_t bytes = 0;     // the file's size
  uint32_t ends = 0;     // CRC32C of its first and last 4 KiB: a content stand-in for the fingerprint
  int64_t windows = 0;   // windows of `frame` samples at the source's rate
};

// The header facts of `path` (any file data/audio.h reads); Error naming it
// when it is not one, is empty, or is a WAV whose header promises more
// frames than it holds.
AudioClip audio_clip(const std::string& path);

class AudioWindows final : public ExampleSource {
 public:
  // Clips at `rate` Hz (their own rate when equal, else resampled), windows
  // of `frame` samples; `limit` > 0 keeps the first `limit` windows only.
  AudioWindows(std::vector<AudioClip> clips, int rate, int64_t frame, int64_t limit = 0);
  int64_t rows() const override { return rows_; }
  int64_t dim() const override { return frame_; }
  void read(int64_t row, float* out) const override;
  uint32_t fingerprint(uint32_t crc) const override;
  const std::vector<AudioClip>& clips() const { return clips_; }

 private:
  std::vector<AudioClip> clips_;
  std::vector<int64_t> ends_;  // running sums of clips_[i].windows
  int rate_;
  int64_t frame_, rows_ = 0;
};

}  // namespace vqddp
