#include "data/audio.h"

#include <sndfile.h>
#include <soxr.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include <unistd.h>

#include "engine/error.h"
#include "engine/file_io.h"

namespace vqddp {

namespace {

// File frames decoded at a time: fixed, so that the samples (resampling
// included) never depend on how much a caller reads at once.
constexpr sf_count_t kBlockFrames = 1 << 16;

struct SndfileCloser {
  void operator()(SNDFILE* f) const { sf_close(f); }
};
using Sndfile = std::unique_ptr<SNDFILE, SndfileCloser>;

struct SoxrCloser {
  void operator()(soxr_t s) const { soxr_delete(s); }
};
using Soxr = std::unique_ptr<std::remove_pointer_t<soxr_t>, SoxrCloser>;

Sndfile open_audio(const std::string& path, SF_INFO& info) {
  require_regular_file(path);
  info = SF_INFO{};
  Sndfile f(sf_open(path.c_str(), SFM_READ, &info));
  VQDDP_CHECK(f != nullptr, "{}: not an audio file libsndfile reads ({})", path, sf_strerror(nullptr));
  VQDDP_CHECK(info.samplerate > 0, "{}: sample rate {} Hz is not a usable rate", path, info.samplerate);
  VQDDP_CHECK(info.channels > 0, "{}: {} channels", path, info.channels);
  return f;
}

bool is_float_format(int format) {
  const int sub = format & SF_FORMAT_SUBMASK;
  return sub == SF_FORMAT_FLOAT || sub == SF_FORMAT_DOUBLE;
}

}  // namespace

struct AudioReader::State {
  SF_INFO info{};
  Sndfile file;
  Soxr soxr;                     // null when no resampling is needed
  std::vector<float> block;      // (kBlockFrames, channels) interleaved
  std::vector<float> mono;       // (kBlockFrames,)
  std::vector<float> resampled;  // the resampler's output buffer, drained call by call
  int64_t frames_read = 0;       // file frames decoded so far
  bool file_done = false, flushed = false;
};

AudioReader::AudioReader(const std::string& path, int rate) : path_(path), s_(std::make_unique<State>()) {
  VQDDP_CHECK(rate >= 0, "{}: target sample rate {} Hz is negative", path, rate);
  s_->file = open_audio(path, s_->info);
  VQDDP_CHECK(s_->info.frames > 0, "{}: no samples (empty file)", path);
  rate_ = rate == 0 ? s_->info.samplerate : rate;
  if (rate_ != s_->info.samplerate) {
    const soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
    const soxr_quality_spec_t quality = soxr_quality_spec(SOXR_HQ, 0);
    soxr_error_t err = nullptr;
    s_->soxr.reset(soxr_create(s_->info.samplerate, rate_, 1, &err, &io, &quality, nullptr));
    VQDDP_CHECK(err == nullptr && s_->soxr, "{}: cannot resample from {} Hz to {} Hz ({})", path,
                s_->info.samplerate, rate_, err ? err : "no resampler");
  }
  s_->block.resize(static_cast<size_t>(kBlockFrames * s_->info.channels));
  s_->mono.resize(static_cast<size_t>(kBlockFrames));
}

AudioReader::~AudioReader() = default;

int AudioReader::file_rate() const { return s_->info.samplerate; }
int AudioReader::channels() const { return s_->info.channels; }
int64_t AudioReader::file_frames() const { return s_->info.frames; }

bool AudioReader::decode_block() {
  State& s = *s_;
  pending_.clear();
  pending_at_ = 0;
  size_t got = 0;
  if (!s.file_done) {
    const int64_t channels = s.info.channels;
    const sf_count_t n = sf_readf_float(s.file.get(), s.block.data(), kBlockFrames);
    VQDDP_CHECK(n > 0 || s.frames_read > 0, "{}: no samples could be decoded ({})", path_, sf_strerror(s.file.get()));
    s.file_done = n < kBlockFrames;
    // A short read is the end of the file, or an error libsndfile met
    // decoding it: the latter must not pass for a shorter clip.
    VQDDP_CHECK(!s.file_done || sf_error(s.file.get()) == SF_ERR_NO_ERROR, "{}: decoding failed after {} frames "
                "({})", path_, s.frames_read + std::max<sf_count_t>(n, 0), sf_strerror(s.file.get()));
    got = static_cast<size_t>(std::max<sf_count_t>(n, 0));
    if (is_float_format(s.info.format))
      for (size_t i = 0; i < got * channels; ++i)
        VQDDP_CHECK(std::isfinite(s.block[i]), "{}: sample {} of channel {} is {} (a float file must hold finite "
                    "samples)", path_, s.frames_read + static_cast<int64_t>(i / channels), i % channels, s.block[i]);
    if (channels == 1) {
      std::copy(s.block.begin(), s.block.begin() + got, s.mono.begin());
    } else {
      const float inv = 1.f / static_cast<float>(channels);
      for (size_t t = 0; t < got; ++t) {
        float sum = 0.f;
        for (int64_t c = 0; c < channels; ++c) sum += s.block[t * channels + c];
        s.mono[t] = sum * inv;
      }
    }
    s.frames_read += static_cast<int64_t>(got);
  } else if (!s.soxr || s.flushed) {
    return false;
  }
  if (!s.soxr) {
    pending_.assign(s.mono.begin(), s.mono.begin() + got);
    return got > 0;
  }
  // The resampler takes the block (or, once the file is done, no input: its
  // flush) and gives what it has, in as many calls as its output needs.
  std::vector<float>& out = s.resampled;
  out.resize(static_cast<size_t>(kBlockFrames));
  const float* in = got > 0 ? s.mono.data() : nullptr;
  size_t left = got;
  for (;;) {
    size_t used = 0, made = 0;
    soxr_error_t err = soxr_process(s.soxr.get(), in, left, &used, out.data(), out.size(), &made);
    VQDDP_CHECK(err == nullptr, "{}: resampling from {} Hz to {} Hz failed ({})", path_, s.info.samplerate, rate_, err);
    pending_.insert(pending_.end(), out.begin(), out.begin() + made);
    if (in) {
      in += used;
      left -= used;
      if (left == 0 && made < out.size()) break;
    } else if (made == 0) {
      s.flushed = true;
      break;
    }
  }
  if (s.file_done && got > 0 && !s.flushed) return true;  // the flush comes with the next call
  return !pending_.empty() || decode_block();
}

size_t AudioReader::read(size_t n, std::vector<float>& out) {
  size_t done = 0;
  while (done < n) {
    if (pending_at_ == pending_.size() && !decode_block()) break;
    const size_t take = std::min(n - done, pending_.size() - pending_at_);
    out.insert(out.end(), pending_.begin() + pending_at_, pending_.begin() + pending_at_ + take);
    pending_at_ += take;
    done += take;
  }
  return done;
}

const std::vector<std::string>& audio_extensions() {
  static const std::vector<std::string> ext{".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3",
                                            ".aif", ".aiff", ".au", ".caf", ".w64"};
  return ext;
}

int audio_file_rate(const std::string& path) {
  SF_INFO info;
  Sndfile f = open_audio(path, info);
  return info.samplerate;
}

Audio read_audio(const std::string& path, int rate) {
  AudioReader reader(path, rate);
  const int64_t frames = reader.file_frames(), channels = reader.channels();
  VQDDP_CHECK(frames <= (int64_t{1} << 32) / channels, "{}: {} frames of {} channels is more than 2^32 samples", path,
              frames, channels);
  Audio a;
  a.file_rate = reader.file_rate();
  a.channels = reader.channels();
  a.sample_rate = reader.sample_rate();
  const double expected = std::ceil(static_cast<double>(frames) * a.sample_rate / a.file_rate);
  VQDDP_CHECK(expected <= 4294967296.0, "{}: {} frames at {} Hz are more than 2^32 samples at {} Hz", path, frames,
              a.file_rate, a.sample_rate);
  a.samples.reserve(static_cast<size_t>(expected) + 64);
  while (reader.read(static_cast<size_t>(kBlockFrames), a.samples) > 0) {
  }
  return a;
}

struct AudioWriter::State {
  Sndfile file;
  std::vector<short> pcm;  // 16-bit encodings: the samples as we round them
};

AudioWriter::AudioWriter(const std::string& path, int rate, AudioEncoding encoding)
    : path_(path), temp_(path + ".tmp." + std::to_string(::getpid())), encoding_(encoding),
      s_(std::make_unique<State>()) {
  VQDDP_CHECK(rate > 0, "{}: sample rate {} Hz is not a usable rate", path, rate);
  SF_INFO info{};
  info.samplerate = rate;
  info.channels = 1;
  info.format = encoding == AudioEncoding::flac16   ? SF_FORMAT_FLAC | SF_FORMAT_PCM_16
                : encoding == AudioEncoding::wav16 ? SF_FORMAT_WAV | SF_FORMAT_PCM_16
                                                   : SF_FORMAT_WAV | SF_FORMAT_FLOAT;
  VQDDP_CHECK(sf_format_check(&info), "{}: libsndfile cannot write this format", path);
  s_->file.reset(sf_open(temp_.c_str(), SFM_WRITE, &info));
  VQDDP_CHECK(s_->file != nullptr, "{}: cannot write ({})", temp_, sf_strerror(nullptr));
}

AudioWriter::~AudioWriter() {
  if (!s_->file) return;
  s_->file.reset();
  std::remove(temp_.c_str());
}

void AudioWriter::write(const float* samples, size_t n) {
  VQDDP_CHECK(s_->file != nullptr, "{}: written after close", path_);
  sf_count_t wrote = 0;
  for (size_t i = 0; i < n; ++i)
    VQDDP_CHECK(std::isfinite(samples[i]), "{}: sample {} to write is {}", path_, written_ + i, samples[i]);
  written_ += n;
  if (encoding_ == AudioEncoding::wav_float) {
    wrote = sf_writef_float(s_->file.get(), samples, static_cast<sf_count_t>(n));
  } else {
    s_->pcm.resize(n);
    for (size_t i = 0; i < n; ++i)
      s_->pcm[i] = static_cast<short>(std::clamp(std::nearbyint(samples[i] * 32768.f), -32768.f, 32767.f));
    wrote = sf_writef_short(s_->file.get(), s_->pcm.data(), static_cast<sf_count_t>(n));
  }
  VQDDP_CHECK(wrote == static_cast<sf_count_t>(n), "{}: writing failed ({})", temp_, sf_strerror(s_->file.get()));
}

void AudioWriter::close() {
  VQDDP_CHECK(s_->file != nullptr, "{}: closed twice", path_);
  sf_write_sync(s_->file.get());
  const int err = sf_close(s_->file.release());
  const bool renamed = err == 0 && std::rename(temp_.c_str(), path_.c_str()) == 0;
  if (!renamed) std::remove(temp_.c_str());
  VQDDP_CHECK(err == 0, "{}: closing failed ({})", temp_, sf_error_number(err));
  VQDDP_CHECK(renamed, "{}: cannot rename {} over it", path_, temp_);
}

void write_audio(const std::string& path, const std::vector<float>& samples, int rate, AudioEncoding encoding) {
  AudioWriter w(path, rate, encoding);
  w.write(samples.data(), samples.size());
  w.close();
}

int64_t convert_audio(const std::string& input, const std::string& output, int rate, AudioEncoding encoding) {
  AudioReader reader(input, rate);
  AudioWriter writer(output, reader.sample_rate(), encoding);
  std::vector<float> block;
  int64_t total = 0;
  for (;;) {
    block.clear();
    if (reader.read(static_cast<size_t>(kBlockFrames), block) == 0) break;
    writer.write(block.data(), block.size());
    total += static_cast<int64_t>(block.size());
  }
  writer.close();
  return total;
}

}  // namespace vqddp
