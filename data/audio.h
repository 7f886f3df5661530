// Audio files through libsndfile: every format and subformat the Debian
// build reads (WAV/AIFF/CAF/W64 PCM 8-32 bit and float, FLAC, Ogg Vorbis
// and Opus, MP3), as mono float samples at a chosen rate; and written back
// as 16-bit or float WAV and 16-bit FLAC.
//
// Rules, stated once:
// - Integer PCM comes as libsndfile's normalised float: n / 2^(bits-1), so
//   16-bit samples are exactly int16 / 32768 in [-1, 1).
// - Several channels are downmixed to their mean: sum over the channels in
//   channel order, in float, then one multiply by 1 / channels.
// - A file at another rate than `rate` is resampled by libsoxr (its high
//   quality, SOXR_HQ, in float32), so every clip of a data set is at one
//   rate; rate 0 keeps the file's own.
// - Files are decoded in blocks of a fixed size (AudioReader), whatever the
//   caller asks for at a time, so a file's samples are the same read whole
//   or piecewise, and a long file needs memory for one block only.
// - Refused, with an Error naming the file: what is not a regular file
//   (engine/core/file_io.h), what libsndfile cannot open (its own reason is in
//   the message), an empty file, a file that gives fewer frames than its
//   header promises (a WAV whose data chunk runs past the end of the file,
//   any file that ends early or shrinks while it is read: the frames
//   promised and found are named), one that resamples to no sample at all, a non-finite sample in a float file (naming
//   the frame and channel), more than 2^32 samples (read whole).
// - 16-bit output is written as x * 32768 rounded to the nearest integer
//   (ties to even), clamped to [-32768, 32767] (not libsndfile's x * 32767),
//   so what the reader gives back is x to the nearest 1/32768: a write-read
//   round trip of 16-bit samples is exact. A non-finite sample is refused.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace vqddp {

// The 16-bit rules above, for raw PCM (`vqddp encode --stream` reads it,
// `decode --stream` writes it) as for files.
inline float from_pcm16(int16_t v) { return static_cast<float>(v) * (1.f / 32768.f); }
inline int16_t to_pcm16(float x) {
  const float v = std::nearbyint(x * 32768.f);
  if (std::isnan(v)) return 0;  // files refuse one before; a raw stream has no way to say it
  return static_cast<int16_t>(v < -32768.f ? -32768.f : v > 32767.f ? 32767.f : v);
}

struct Audio {
  int sample_rate = 0;         // Hz, after resampling
  int file_rate = 0;           // Hz, as stored
  int channels = 0;            // as stored (the samples are their mean)
  std::vector<float> samples;  // (T,) mono
};

// A file's mono samples at one rate, a block at a time (the rules above).
class AudioReader {
 public:
  // `rate` 0: the file's own rate, no resampling.
  explicit AudioReader(const std::string& path, int rate = 0);
  ~AudioReader();
  AudioReader(const AudioReader&) = delete;
  AudioReader& operator=(const AudioReader&) = delete;

  // Appends up to `n` samples to `out`; fewer only at the end of the file.
  // Returns how many were appended (0: the file is done).
  size_t read(size_t n, std::vector<float>& out);

  const std::string& path() const { return path_; }
  int sample_rate() const { return rate_; }
  int file_rate() const;
  int channels() const;
  int64_t file_frames() const;  // as stored, at file_rate()

 private:
  bool decode_block();  // the next block into pending_; false when nothing is left

  struct State;
  std::string path_;
  int rate_ = 0;
  std::unique_ptr<State> s_;
  std::vector<float> pending_;  // decoded, not yet returned
  size_t pending_at_ = 0;
  int64_t produced_ = 0;  // samples returned so far
};

// The whole file (an AudioReader read to its end).
Audio read_audio(const std::string& path, int rate = 0);

// What a file's header says, read from it alone (no sample is decoded); a
// truncated WAV (the rule above) is refused here already.
struct AudioFileInfo {
  int rate = 0;         // Hz, as stored
  int channels = 0;
  int64_t frames = 0;   // as stored, at `rate`
  // The mono samples it gives at `target` Hz (0: its own rate), rounded up.
  int64_t samples_at(int target) const;
};
AudioFileInfo audio_file_info(const std::string& path);

// Samples [first, first + count) of a file's mono signal at `rate` (0: its
// own), decoded from the file alone by seeking to the window, so reading a
// window costs the window, not the file before it (MP3 excepted: its seek
// in libsndfile is not sample-exact, so an MP3 is decoded from its start):
// - at the file's own rate, the samples AudioReader gives at those positions;
// - resampled, the window with a context of kWindowContext samples each side
//   (cut at the file's ends) is resampled by one soxr_oneshot (SOXR_HQ,
//   float32) from a file frame where both rates' sample grids meet, so a
//   window's samples are a function of (file, rate, first, count) alone: the
//   same on every rank and in every run. They match the whole file's
//   resampling to within the filter's rounding, not bit for bit.
// Refused with an Error naming the file: a window that runs past the file's
// end (a file shorter than when it was indexed, or cut short), a decoding
// error, a non-finite sample in a float file, and, given `indexed`, a
// header that no longer says what it did when the file was indexed.
constexpr int64_t kWindowContext = 1024;
void read_audio_window(const std::string& path, int rate, int64_t first, int64_t count, float* out,
                       const AudioFileInfo* indexed = nullptr);

// Samples at `from` Hz as samples at `to` Hz, by one soxr_oneshot (SOXR_HQ,
// as files are read): round(n * to / from) samples, aligned with the input
// (soxr compensates its filter's delay). Equal rates return a copy. For
// signals already in memory: classic codecs at their own rates, STOI at
// 10 kHz (tools and metrics, not the training data path).
std::vector<float> resample(const std::vector<float>& samples, int from, int to);

// The extensions a data directory's audio files may have (lower case, with
// the dot): what the file name must end with to be read as a clip.
const std::vector<std::string>& audio_extensions();

enum class AudioEncoding { wav16, wav_float, flac16 };

// Mono samples into a new file through engine/core/output_file.h (a temporary
// created exclusively, renamed over `path` by close()): a writer destroyed
// before close() (an error midway), a close that fails, or SIGINT/SIGTERM
// removes its temporary, so `path` is either the old file or the whole new
// one. close() refuses a file of zero samples: nothing could open it.
class AudioWriter {
 public:
  AudioWriter(const std::string& path, int rate, AudioEncoding encoding);
  ~AudioWriter();
  AudioWriter(const AudioWriter&) = delete;
  AudioWriter& operator=(const AudioWriter&) = delete;

  void write(const float* samples, size_t n);
  void close();

 private:
  struct State;
  std::string path_;
  AudioEncoding encoding_;
  size_t written_ = 0;  // samples so far (for error messages)
  std::unique_ptr<State> s_;
};

// One call: AudioWriter, write, close.
void write_audio(const std::string& path, const std::vector<float>& samples, int rate, AudioEncoding encoding);

// `input` (any file AudioReader reads) as a mono file `output` at `rate`
// (0: the input's own), streamed a block at a time. Returns the samples written.
int64_t convert_audio(const std::string& input, const std::string& output, int rate, AudioEncoding encoding);

}  // namespace vqddp
