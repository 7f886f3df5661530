#include "data/audio.h"

#include <sndfile.h>
#include <soxr.h>

#include <cmath>
#include <cstdint>
#include <memory>

#include "engine/error.h"
#include "engine/file_io.h"

namespace vqddp {

namespace {

struct SndfileCloser {
  void operator()(SNDFILE* f) const { sf_close(f); }
};
using Sndfile = std::unique_ptr<SNDFILE, SndfileCloser>;

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

std::vector<float> resample(const std::string& path, const std::vector<float>& in, int from, int to) {
  const double ratio = static_cast<double>(to) / from;
  std::vector<float> out(static_cast<size_t>(std::ceil(static_cast<double>(in.size()) * ratio)) + 16);
  size_t done = 0;
  const soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
  const soxr_quality_spec_t quality = soxr_quality_spec(SOXR_HQ, 0);
  soxr_error_t err = soxr_oneshot(from, to, 1, in.data(), in.size(), nullptr, out.data(), out.size(), &done, &io,
                                  &quality, nullptr);
  VQDDP_CHECK(err == nullptr, "{}: resampling from {} Hz to {} Hz failed ({})", path, from, to, err);
  out.resize(done);
  return out;
}

}  // namespace

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
  VQDDP_CHECK(rate >= 0, "{}: target sample rate {} Hz is negative", path, rate);
  SF_INFO info;
  Sndfile f = open_audio(path, info);
  const int64_t frames = info.frames, channels = info.channels;
  VQDDP_CHECK(frames > 0, "{}: no samples (empty file)", path);
  VQDDP_CHECK(frames <= (int64_t{1} << 32) / channels, "{}: {} frames of {} channels is more than 2^32 samples", path,
              frames, channels);
  std::vector<float> interleaved(static_cast<size_t>(frames * channels));
  const sf_count_t got = sf_readf_float(f.get(), interleaved.data(), frames);
  VQDDP_CHECK(got > 0, "{}: no samples could be decoded ({})", path, sf_strerror(f.get()));
  interleaved.resize(static_cast<size_t>(got * channels));
  if (is_float_format(info.format))
    for (size_t i = 0; i < interleaved.size(); ++i)
      VQDDP_CHECK(std::isfinite(interleaved[i]), "{}: sample {} of channel {} is {} (a float file must hold finite "
                  "samples)", path, i / channels, i % channels, interleaved[i]);
  Audio a;
  a.file_rate = info.samplerate;
  a.channels = info.channels;
  if (channels == 1) {
    a.samples = std::move(interleaved);
  } else {
    a.samples.resize(static_cast<size_t>(got));
    const float inv = 1.f / static_cast<float>(channels);
    for (int64_t t = 0; t < got; ++t) {
      float s = 0.f;
      for (int64_t c = 0; c < channels; ++c) s += interleaved[t * channels + c];
      a.samples[t] = s * inv;
    }
  }
  a.sample_rate = rate == 0 ? info.samplerate : rate;
  if (a.sample_rate != info.samplerate) a.samples = resample(path, a.samples, info.samplerate, a.sample_rate);
  return a;
}

}  // namespace vqddp
