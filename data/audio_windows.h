// A data source of audio windows read on demand: row r is a window of
// `frame` consecutive samples of one clip at the data set's rate, the
// clips' non-overlapping windows laid end to end in clip order (each clip's
// tail shorter than a window dropped). A clip is a file, or a segment of one
// (offset and duration in seconds, rounded to the nearest sample at the
// rate). Built from the clips' headers alone (no sample is decoded to plan
// a run: data/audio_index.h); each read decodes one window from its file
// (data/audio.h read_audio_window), so memory does not depend on the
// corpus's size.
//
// A clip's weight w (1 by default) gives it round(w * windows) rows: w > 1
// repeats its windows in turn (row k is window k mod windows), w < 1 thins
// them to rows spread evenly over the clip (row k is window
// floor(k * windows / rows)), so the clip is drawn about w times as often
// per window as a clip of weight 1 of its source.
//
// Each read checks the file's size and modification time against the
// index's, and its header's rate, channels and frames: a file changed
// since it was indexed is refused by name, so a row's samples are always
// the indexed file's.
//
// Every number is bounded before it is converted: a segment's offset and
// duration in [0, kMaxClipSeconds], a weight in (0, kMaxClipWeight], and a
// source's rows at most kMaxSourceRows, so no sample position or row count
// can overflow.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/example_source.h"

namespace vqddp {

inline constexpr double kMaxClipSeconds = 1e7;  // 116 days: at 1 MHz, 10^13 samples
inline constexpr double kMaxClipWeight = 1e6;
inline constexpr int64_t kMaxSourceRows = int64_t{1} << 53;  // exact as a double too

// What a clip's header and file say, read once when the source is built.
struct AudioClip {
  std::string path;
  int file_rate = 0, channels = 0;
  int64_t frames = 0;    // as stored, at file_rate
  int64_t bytes = 0;     // the file's size
  int64_t mtime_ns = 0;  // its modification time (the index's check; not in the fingerprint)
  uint32_t ends = 0;     // CRC32C of its first and last 4 KiB: a content stand-in for the fingerprint
  uint64_t device = 0, inode = 0;  // its identity when indexed (neither cached nor in the fingerprint)
  // The clip within the file, and its weight (a manifest's entry).
  double offset = 0, duration = -1, weight = 1;
  // Set by AudioWindows: the first sample at the source's rate, the
  // clip's whole windows of `frame` samples, and its rows (by its weight).
  int64_t first = 0, windows = 0, rows = 0;
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
  int64_t next_origin(int64_t row) const override;  // the next clip's first row
  const std::vector<AudioClip>& clips() const { return clips_; }

 private:
  void place(AudioClip& c, int64_t limit) const;  // sets c's first, windows and rows after rows_

  std::vector<AudioClip> clips_;
  std::vector<int64_t> ends_;  // running sums of clips_[i].rows
  int rate_;
  int64_t frame_, rows_ = 0;
};

}  // namespace vqddp
