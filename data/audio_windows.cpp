#include "data/audio_windows.h"

#include <algorithm>
#include <cmath>

#include "data/audio.h"
#include "data/data_file.h"
#include "engine/core/error.h"
#include "engine/core/file_io.h"

namespace vqddp {

AudioClip audio_clip(const std::string& path) {
  AudioClip c;
  c.path = path;
  const AudioFileInfo info = audio_file_info(path);  // refuses a truncated WAV, names the file
  c.file_rate = info.rate;
  c.channels = info.channels;
  c.frames = info.frames;
  VQDDP_CHECK(c.frames > 0, "{}: no samples (empty file)", path);
  const DataFile file(path);
  c.bytes = file.stamp().bytes;
  c.mtime_ns = file.stamp().mtime_ns;
  c.device = file.stamp().device;
  c.inode = file.stamp().inode;
  c.ends = ends_crc(file, path);
  return c;
}

namespace {

// The clip's segment and weight within bounds, before any is converted to
// samples or rows (a weight of 1e6 on an offset of 1e300 s once wrapped
// the row count and passed the "past its end" check).
void check_segment(const AudioClip& c) {
  auto seconds = [](double v) { return std::isfinite(v) && v >= 0 && v <= kMaxClipSeconds; };
  VQDDP_CHECK(seconds(c.offset), "{}: offset {} s is not in [0, {:g}] s", c.path, c.offset, kMaxClipSeconds);
  VQDDP_CHECK(c.duration < 0 || seconds(c.duration), "{}: duration {} s is not in (0, {:g}] s", c.path, c.duration,
              kMaxClipSeconds);
  VQDDP_CHECK(std::isfinite(c.weight) && c.weight > 0 && c.weight <= kMaxClipWeight, "{}: weight {} is not in (0, "
              "{:g}]", c.path, c.weight, kMaxClipWeight);
  VQDDP_CHECK(c.file_rate > 0 && c.channels > 0 && c.frames > 0, "{}: {} frames of {} channels at {} Hz", c.path,
              c.frames, c.channels, c.file_rate);
}

}  // namespace

AudioWindows::AudioWindows(std::vector<AudioClip> clips, int rate, int64_t frame, int64_t limit)
    : clips_(std::move(clips)), rate_(rate), frame_(frame) {
  VQDDP_CHECK(rate > 0 && frame > 0, "audio windows of {} samples at {} Hz", frame, rate);
  for (AudioClip& c : clips_) {
    try {
      place(c, limit);
    } catch (const Error& e) {
      throw with_path_shown(e, c.path);
    }
    rows_ += c.rows;
    ends_.push_back(rows_);
  }
}

void AudioWindows::place(AudioClip& c, int64_t limit) const {
  check_segment(c);
  // Whole output samples the file spans at the rate, rounded down, so every
  // window lies inside what its file gives; then the clip's segment
  // (seconds x rate < 10^7 x 2^31 fits).
  const __int128 spanned = static_cast<__int128>(c.frames) * rate_ / c.file_rate;
  VQDDP_CHECK(spanned <= kMaxSourceRows, "{}: {} frames at {} Hz are more than 2^53 samples at {} Hz", c.path,
              c.frames, c.file_rate, rate_);
  const auto samples = static_cast<int64_t>(spanned);
  c.first = std::llround(c.offset * rate_);
  VQDDP_CHECK(c.first < samples, "{}: offset {} s is at or past its end ({:.3f} s)", c.path, c.offset,
              static_cast<double>(samples) / rate_);
  const int64_t span =
      c.duration < 0 ? samples - c.first : std::min(samples - c.first, static_cast<int64_t>(std::llround(c.duration * rate_)));
  c.windows = span / frame_;
  const double rows = c.weight * static_cast<double>(c.windows);
  VQDDP_CHECK(rows <= static_cast<double>(kMaxSourceRows - rows_), "{}: weight {} on its {} windows makes more than "
              "2^53 rows in its source", c.path, c.weight, c.windows);
  c.rows = c.weight == 1 ? c.windows : std::llround(rows);
  if (limit > 0) c.rows = std::clamp<int64_t>(limit - rows_, 0, c.rows);
}

void AudioWindows::read(int64_t row, float* out) const {
  VQDDP_CHECK(row >= 0 && row < rows_, "audio window {} of {}", row, rows_);
  const size_t clip = static_cast<size_t>(std::upper_bound(ends_.begin(), ends_.end(), row) - ends_.begin());
  const int64_t k = row - (clip == 0 ? 0 : ends_[clip - 1]);
  const AudioClip& c = clips_[clip];
  const int64_t window = c.rows >= c.windows ? k % c.windows : k * c.windows / c.rows;
  try {
    const FileStamp now = file_stamp(c.path);
    VQDDP_CHECK(now.bytes == c.bytes && now.mtime_ns == c.mtime_ns, "{}: changed since it was indexed ({} bytes then, "
                "{} now{})", c.path, c.bytes, now.bytes, now.mtime_ns == c.mtime_ns ? "" : "; modified since");
    const AudioFileInfo indexed{c.file_rate, c.channels, c.frames};
    read_audio_window(c.path, c.file_rate == rate_ ? 0 : rate_, c.first + window * frame_, frame_, out, &indexed);
  } catch (const Error& e) {
    throw with_path_shown(e, c.path);
  }
}

int64_t AudioWindows::next_origin(int64_t row) const {
  return *std::upper_bound(ends_.begin(), ends_.end(), row);
}

uint32_t AudioWindows::fingerprint(uint32_t crc) const {
  const int64_t head[3] = {rate_, frame_, rows_};
  crc = crc32c(head, sizeof head, crc);
  for (const AudioClip& c : clips_) {
    const int64_t facts[8] = {c.file_rate, c.channels, c.frames, c.bytes, c.ends, c.first, c.windows, c.rows};
    crc = crc32c(facts, sizeof facts, crc);
  }
  return crc;
}

}  // namespace vqddp
