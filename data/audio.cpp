#include "data/audio.h"

#include <sndfile.h>
#include <soxr.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <optional>
#include <string>

#include <fcntl.h>
#include <unistd.h>

#include <cstring>

#include "data/data_file.h"
#include "engine/core/error.h"
#include "engine/core/file_io.h"
#include "engine/core/memory_budget.h"
#include "engine/core/output_file.h"

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
  DataFile file(path);  // refuses a FIFO, a device, a link loop, in words
  info = SF_INFO{};
  // libsndfile closes the descriptor with the file, or at once when it fails.
  Sndfile f(sf_open_fd(file.release(), SFM_READ, &info, SF_TRUE));
  VQDDP_CHECK(f != nullptr, "{}: not an audio file libsndfile reads ({})", path, sf_strerror(nullptr));
  VQDDP_CHECK(info.samplerate > 0, "{}: sample rate {} Hz is not a usable rate", path, info.samplerate);
  VQDDP_CHECK(info.channels > 0, "{}: {} channels", path, info.channels);
  return f;
}

// The frames a RIFF WAV file's header promises: its data chunk's size over
// the block size of its fmt chunk. libsndfile trusts the file's length over
// the header (a cut file opens as a shorter one), so this is what tells a
// truncated WAV from a short one. nullopt where the header promises nothing
// checkable: not RIFF/WAVE, no fmt before data, or a data size of 0 or
// near 2^31 or 2^32, which streaming writers put there when they cannot
// know the length (ffmpeg, sox and others writing to a pipe).
std::optional<int64_t> wav_promised_frames(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  auto read_at = [&](off_t at, void* buf, size_t n) { return ::pread(fd, buf, n, at) == static_cast<ssize_t>(n); };
  auto le32 = [](const unsigned char* p) { return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24; };
  std::optional<int64_t> promised;
  unsigned char head[12];
  uint32_t block_align = 0;
  if (read_at(0, head, 12) && std::memcmp(head, "RIFF", 4) == 0 && std::memcmp(head + 8, "WAVE", 4) == 0) {
    off_t at = 12;
    for (int chunk = 0; chunk < 4096; ++chunk) {
      unsigned char c[8];
      if (!read_at(at, c, 8)) break;
      const uint32_t size = le32(c + 4);
      if (std::memcmp(c, "fmt ", 4) == 0) {
        unsigned char fmt_chunk[14];
        if (size < 14 || !read_at(at + 8, fmt_chunk, 14)) break;
        block_align = uint32_t{fmt_chunk[12]} | uint32_t{fmt_chunk[13]} << 8;
      } else if (std::memcmp(c, "data", 4) == 0) {
        if (block_align > 0 && size > 0 && size < 0x7fff0000u) promised = size / block_align;
        break;
      }
      at += 8 + static_cast<off_t>(size) + (size & 1);  // chunks are padded to an even size
    }
  }
  ::close(fd);
  return promised;
}

// A WAV whose header promises more frames than the file holds is refused
// (libsndfile would open it as a shorter clip).
void refuse_truncated_wav(const std::string& path, const SF_INFO& info) {
  if ((info.format & SF_FORMAT_TYPEMASK) != SF_FORMAT_WAV) return;
  const std::optional<int64_t> promised = wav_promised_frames(path);
  VQDDP_CHECK(!promised || *promised <= info.frames, "{}: truncated: its header promises {} frames ({:.2f} s) "
              "but the file holds {} ({:.2f} s)", path, *promised, static_cast<double>(*promised) / info.samplerate,
              info.frames, static_cast<double>(info.frames) / info.samplerate);
}

bool is_float_format(int format) {
  const int sub = format & SF_FORMAT_SUBMASK;
  return sub == SF_FORMAT_FLOAT || sub == SF_FORMAT_DOUBLE;
}

// `frames` interleaved frames of `info`'s file, decoded from file frame
// `at`, into mono: a float file's samples are checked finite, and several
// channels become their mean (the rule in audio.h, written once here).
void to_mono(const std::string& path, const SF_INFO& info, int64_t at, const float* block, size_t frames, float* mono) {
  const int64_t channels = info.channels;
  if (is_float_format(info.format))
    for (size_t i = 0; i < frames * channels; ++i)
      VQDDP_CHECK(std::isfinite(block[i]), "{}: sample {} of channel {} is {} (a float file must hold finite "
                  "samples)", path, at + static_cast<int64_t>(i / channels), i % channels, block[i]);
  if (channels == 1) {
    std::copy(block, block + frames, mono);
    return;
  }
  const float inv = 1.f / static_cast<float>(channels);
  for (size_t t = 0; t < frames; ++t) {
    float sum = 0.f;
    for (int64_t c = 0; c < channels; ++c) sum += block[t * channels + c];
    mono[t] = sum * inv;
  }
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
  refuse_truncated_wav(path, s_->info);
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
    const sf_count_t n = sf_readf_float(s.file.get(), s.block.data(), kBlockFrames);
    VQDDP_CHECK(n > 0 || s.frames_read > 0, "{}: no samples could be decoded ({})", path_, sf_strerror(s.file.get()));
    s.file_done = n < kBlockFrames;
    // A short read is the end of the file, or an error libsndfile met
    // decoding it: the latter must not pass for a shorter clip.
    VQDDP_CHECK(!s.file_done || sf_error(s.file.get()) == SF_ERR_NO_ERROR, "{}: decoding failed after {} frames "
                "({})", path_, s.frames_read + std::max<sf_count_t>(n, 0), sf_strerror(s.file.get()));
    got = static_cast<size_t>(std::max<sf_count_t>(n, 0));
    // Every frame the header promised must come: fewer is a file cut short
    // or shrunk while it was read, not a shorter clip. (MPEG's frame count
    // is an estimate where the file has no index, so it is not held to it.)
    const int64_t decoded = s.frames_read + static_cast<int64_t>(got);
    VQDDP_CHECK(!s.file_done || decoded == s.info.frames || (s.info.format & SF_FORMAT_TYPEMASK) == SF_FORMAT_MPEG,
                "{}: {} frames could be decoded of the {} its header promises: the file is truncated, or changed while "
                "it was read", path_, decoded, s.info.frames);
    to_mono(path_, s.info, s.frames_read, s.block.data(), got, s.mono.data());
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
    if (pending_at_ == pending_.size() && !decode_block()) {
      VQDDP_CHECK(produced_ > 0, "{}: {} frames at {} Hz resample to no sample at {} Hz: too short to use", path_,
                  s_->info.frames, s_->info.samplerate, rate_);
      break;
    }
    const size_t take = std::min(n - done, pending_.size() - pending_at_);
    out.insert(out.end(), pending_.begin() + pending_at_, pending_.begin() + pending_at_ + take);
    pending_at_ += take;
    done += take;
    produced_ += static_cast<int64_t>(take);
  }
  return done;
}

void read_audio_window(const std::string& path, int rate, int64_t first, int64_t count, float* out,
                       const AudioFileInfo* indexed) {
  VQDDP_CHECK(rate >= 0 && first >= 0 && count > 0, "{}: window [{}, {}) at {} Hz", path, first, first + count, rate);
  SF_INFO info;
  Sndfile f = open_audio(path, info);
  // The header is read anyway: checking it costs nothing, and a file
  // rewritten in place (same size, its time set back) is caught here.
  VQDDP_CHECK(!indexed || (info.samplerate == indexed->rate && info.channels == indexed->channels &&
                           info.frames == indexed->frames),
              "{}: changed since it was indexed: its header says {} Hz, {} channels, {} frames, not {} Hz, {} "
              "channels, {} frames", path, info.samplerate, info.channels, static_cast<int64_t>(info.frames),
              indexed->rate, indexed->channels, indexed->frames);
  const int64_t in_rate = info.samplerate, out_rate = rate == 0 ? in_rate : rate;
  // File frames [from, from + n) as mono; all of them must come.
  std::vector<float> block, mono;
  auto decode = [&](int64_t from, int64_t n) {
    VQDDP_CHECK(from + n <= info.frames, "{}: samples up to {} at {} Hz are asked of a file of {} frames at {} Hz: "
                "it is shorter than when it was indexed, or cut short", path, first + count, out_rate, info.frames,
                in_rate);
    if ((info.format & SF_FORMAT_TYPEMASK) == SF_FORMAT_MPEG) {
      // libsndfile's MP3 seek lands elsewhere than its sequential decode
      // (measured: a window at frame 4093 matched frame 2346 of the whole
      // file); decoding from the start is slower and right.
      block.resize(static_cast<size_t>(std::min<int64_t>(from, kBlockFrames) * info.channels));
      for (int64_t done = 0; done < from;) {
        const sf_count_t want = std::min<int64_t>(from - done, static_cast<int64_t>(block.size()) / info.channels);
        const sf_count_t got = sf_readf_float(f.get(), block.data(), want);
        VQDDP_CHECK(got == want, "{}: {} frames could be decoded before frame {}: the file is truncated, or changed "
                    "since it was indexed ({})", path, done + std::max<sf_count_t>(got, 0), from, sf_strerror(f.get()));
        done += got;
      }
    } else {
      VQDDP_CHECK(sf_seek(f.get(), from, SEEK_SET) == from, "{}: cannot seek to frame {} ({})", path, from,
                  sf_strerror(f.get()));
    }
    block.resize(static_cast<size_t>(n * info.channels));
    mono.resize(static_cast<size_t>(n));
    const sf_count_t got = sf_readf_float(f.get(), block.data(), n);
    VQDDP_CHECK(got == n, "{}: {} frames could be decoded from frame {} of the {} asked for: the file is truncated, or "
                "changed since it was indexed ({})", path, std::max<sf_count_t>(got, 0), from, n, sf_strerror(f.get()));
    to_mono(path, info, from, block.data(), static_cast<size_t>(n), mono.data());
  };
  if (out_rate == in_rate) {
    decode(first, count);
    std::copy(mono.begin(), mono.end(), out);
    return;
  }
  // The grids meet every in/g file frames and out/g output samples (g their
  // gcd): start there, at or before the context, so the window's samples
  // sit at the same phase of the filter whatever window is read.
  const int64_t g = std::gcd(in_rate, out_rate), step_in = in_rate / g, step_out = out_rate / g;
  const int64_t start_out = std::max<int64_t>(0, first - kWindowContext) / step_out * step_out;
  const int64_t start_in = start_out / step_out * step_in;
  const int64_t end_out = first + count + kWindowContext;
  const int64_t end_in = std::min<int64_t>(info.frames, (end_out * in_rate + out_rate - 1) / out_rate);
  VQDDP_CHECK(end_in > start_in, "{}: window [{}, {}) at {} Hz starts past the file's {} frames at {} Hz", path, first,
              first + count, out_rate, info.frames, in_rate);
  decode(start_in, end_in - start_in);
  std::vector<float> resampled(static_cast<size_t>((end_in - start_in) * out_rate / in_rate + 64));
  const soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
  const soxr_quality_spec_t quality = soxr_quality_spec(SOXR_HQ, 0);
  size_t used = 0, made = 0;
  soxr_error_t err = soxr_oneshot(static_cast<double>(in_rate), static_cast<double>(out_rate), 1, mono.data(),
                                  mono.size(), &used, resampled.data(), resampled.size(), &made, &io, &quality, nullptr);
  VQDDP_CHECK(err == nullptr, "{}: resampling from {} Hz to {} Hz failed ({})", path, in_rate, out_rate, err);
  const int64_t skip = first - start_out;
  VQDDP_CHECK(skip + count <= static_cast<int64_t>(made), "{}: samples up to {} at {} Hz are asked of a file of {} "
              "frames at {} Hz (about {} samples): it is shorter than when it was indexed, or cut short", path,
              first + count, out_rate, info.frames, in_rate, start_out + static_cast<int64_t>(made));
  std::copy(resampled.begin() + skip, resampled.begin() + skip + count, out);
}

std::vector<float> resample(const std::vector<float>& samples, int from, int to) {
  VQDDP_CHECK(from > 0 && to > 0, "resample: rates must be positive, not {} Hz to {} Hz", from, to);
  if (from == to || samples.empty()) return samples;
  const size_t n = static_cast<size_t>(std::llround(static_cast<double>(samples.size()) * to / from));
  std::vector<float> out(n);
  const soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
  const soxr_quality_spec_t quality = soxr_quality_spec(SOXR_HQ, 0);
  size_t used = 0, made = 0;
  soxr_error_t err = soxr_oneshot(static_cast<double>(from), static_cast<double>(to), 1, samples.data(), samples.size(),
                                  &used, out.data(), out.size(), &made, &io, &quality, nullptr);
  VQDDP_CHECK(err == nullptr, "resampling {} samples from {} Hz to {} Hz failed ({})", samples.size(), from, to, err);
  out.resize(made);
  out.resize(n, 0.0f);  // soxr may stop a sample short of the rounded length
  return out;
}

const std::vector<std::string>& audio_extensions() {
  static const std::vector<std::string> ext{".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3",
                                            ".aif", ".aiff", ".au", ".caf", ".w64"};
  return ext;
}

AudioFileInfo audio_file_info(const std::string& path) {
  SF_INFO info;
  Sndfile f = open_audio(path, info);
  refuse_truncated_wav(path, info);
  return {info.samplerate, info.channels, static_cast<int64_t>(info.frames)};
}

int64_t AudioFileInfo::samples_at(int target) const {
  if (target == 0 || target == rate) return frames;
  return static_cast<int64_t>(std::ceil(static_cast<double>(frames) * target / rate));
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
  const int64_t expected = AudioFileInfo{a.file_rate, a.channels, frames}.samples_at(a.sample_rate);
  VQDDP_CHECK(expected <= (int64_t{1} << 32), "{}: {} frames at {} Hz are more than 2^32 samples at {} Hz", path,
              frames, a.file_rate, a.sample_rate);
  require_memory(expected * int64_t{sizeof(float)}, path, "its samples as 32-bit floats");
  a.samples.reserve(static_cast<size_t>(expected) + 64);
  while (reader.read(static_cast<size_t>(kBlockFrames), a.samples) > 0) {
  }
  return a;
}

struct AudioWriter::State {
  std::optional<OutputFile> out;  // libsndfile writes to its descriptor
  Sndfile file;
  std::vector<short> pcm;  // 16-bit encodings: the samples as we round them
};

AudioWriter::AudioWriter(const std::string& path, int rate, AudioEncoding encoding)
    : path_(path), encoding_(encoding), s_(std::make_unique<State>()) {
  VQDDP_CHECK(rate > 0, "{}: sample rate {} Hz is not a usable rate", path, rate);
  SF_INFO info{};
  info.samplerate = rate;
  info.channels = 1;
  info.format = encoding == AudioEncoding::flac16   ? SF_FORMAT_FLAC | SF_FORMAT_PCM_16
                : encoding == AudioEncoding::wav16 ? SF_FORMAT_WAV | SF_FORMAT_PCM_16
                                                   : SF_FORMAT_WAV | SF_FORMAT_FLOAT;
  VQDDP_CHECK(sf_format_check(&info), "{}: libsndfile cannot write this format", path);
  s_->out.emplace(path);
  s_->file.reset(sf_open_fd(s_->out->fd(), SFM_WRITE, &info, SF_FALSE));
  VQDDP_CHECK(s_->file != nullptr, "{}: cannot write ({})", path, sf_strerror(nullptr));
}

// An unclosed writer's temporary goes with its OutputFile.
AudioWriter::~AudioWriter() { s_->file.reset(); }

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
      s_->pcm[i] = to_pcm16(samples[i]);
    wrote = sf_writef_short(s_->file.get(), s_->pcm.data(), static_cast<sf_count_t>(n));
  }
  VQDDP_CHECK(wrote == static_cast<sf_count_t>(n), "{}: writing failed ({})", path_, sf_strerror(s_->file.get()));
}

void AudioWriter::close() {
  VQDDP_CHECK(s_->file != nullptr, "{}: closed twice", path_);
  VQDDP_CHECK(written_ > 0, "{}: no sample to write: an audio file of zero samples is refused", path_);
  // sf_close finishes the header (sizes, FLAC's STREAMINFO); the descriptor
  // stays open for the OutputFile, which syncs and renames it.
  const int err = sf_close(s_->file.release());
  VQDDP_CHECK(err == 0, "{}: closing failed ({})", path_, sf_error_number(err));
  s_->out->commit();
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
