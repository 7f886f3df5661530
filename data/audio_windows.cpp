#include "data/audio_windows.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <tuple>

#include "data/audio.h"
#include "engine/core/error.h"
#include "engine/core/file_io.h"

#include <fcntl.h>
#include <unistd.h>

namespace vqddp {

namespace {

// CRC32C of a file's first and last 4 KiB (all of it when smaller).
uint32_t ends_crc(const std::string& path, int64_t bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  VQDDP_CHECK(fd >= 0, "{}: cannot open it to read", path);
  constexpr int64_t kEnd = 4096;
  std::vector<char> buf(static_cast<size_t>(std::min(bytes, 2 * kEnd)));
  const int64_t head = std::min(bytes, kEnd), tail = static_cast<int64_t>(buf.size()) - head;
  const bool ok = ::pread(fd, buf.data(), head, 0) == head &&
                  (tail == 0 || ::pread(fd, buf.data() + head, tail, bytes - tail) == tail);
  ::close(fd);
  VQDDP_CHECK(ok, "{}: cannot read its first and last bytes", path);
  return crc32c(buf.data(), buf.size());
}

}  // namespace

std::pair<int64_t, int64_t> file_size_and_time(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  VQDDP_CHECK(!ec, "{}: {}", path, ec.message());
  const auto time = std::filesystem::last_write_time(path, ec);
  VQDDP_CHECK(!ec, "{}: {}", path, ec.message());
  return {static_cast<int64_t>(size),
          std::chrono::duration_cast<std::chrono::nanoseconds>(time.time_since_epoch()).count()};
}

AudioClip audio_clip(const std::string& path) {
  AudioClip c;
  c.path = path;
  const AudioFileInfo info = audio_file_info(path);  // refuses a truncated WAV, names the file
  c.file_rate = info.rate;
  c.channels = info.channels;
  c.frames = info.frames;
  VQDDP_CHECK(c.frames > 0, "{}: no samples (empty file)", path);
  std::tie(c.bytes, c.mtime_ns) = file_size_and_time(path);
  c.ends = ends_crc(path, c.bytes);
  return c;
}

AudioWindows::AudioWindows(std::vector<AudioClip> clips, int rate, int64_t frame, int64_t limit)
    : clips_(std::move(clips)), rate_(rate), frame_(frame) {
  VQDDP_CHECK(rate > 0 && frame > 0, "audio windows of {} samples at {} Hz", frame, rate);
  for (AudioClip& c : clips_) {
    // Whole output samples the file spans at `rate`, rounded down, so every
    // window lies inside what its file gives; then the clip's segment.
    const int64_t samples = c.file_rate == rate ? c.frames : c.frames * rate / c.file_rate;
    c.first = std::llround(c.offset * rate);
    VQDDP_CHECK(c.first < samples, "{}: offset {} s is at or past its end ({:.3f} s)", c.path, c.offset,
                static_cast<double>(samples) / rate);
    const int64_t span = c.duration < 0 ? samples - c.first
                                        : std::min(samples - c.first, static_cast<int64_t>(std::llround(c.duration * rate)));
    c.windows = span / frame;
    c.rows = c.weight == 1 ? c.windows : static_cast<int64_t>(std::llround(c.weight * static_cast<double>(c.windows)));
    if (limit > 0) c.rows = std::clamp<int64_t>(limit - rows_, 0, c.rows);
    rows_ += c.rows;
    ends_.push_back(rows_);
  }
}

void AudioWindows::read(int64_t row, float* out) const {
  VQDDP_CHECK(row >= 0 && row < rows_, "audio window {} of {}", row, rows_);
  const size_t clip = static_cast<size_t>(std::upper_bound(ends_.begin(), ends_.end(), row) - ends_.begin());
  const int64_t k = row - (clip == 0 ? 0 : ends_[clip - 1]);
  const AudioClip& c = clips_[clip];
  const int64_t window = c.rows >= c.windows ? k % c.windows : k * c.windows / c.rows;
  const auto [bytes, mtime] = file_size_and_time(c.path);
  VQDDP_CHECK(bytes == c.bytes && mtime == c.mtime_ns, "{}: changed since it was indexed ({} bytes then, {} now{})",
              c.path, c.bytes, bytes, mtime == c.mtime_ns ? "" : "; modified since");
  read_audio_window(c.path, c.file_rate == rate_ ? 0 : rate_, c.first + window * frame_, frame_, out);
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
