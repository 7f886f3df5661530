// Classic codecs through their libraries (tool/classic_codec.h), on real
// speech: specs parse or are refused by name; each codec's output has the
// input's length, costs about its nominal bitrate, and is aligned with the
// input (its delay removed) at the clip's own rate and at 16 kHz.
//
// Alignment is found by cross-correlation over lags either side of 0, so a
// wrong delay shows as a peak away from 0. Opus matches the waveform, so the
// samples themselves are correlated (peak within a sample of 0). Codec 2
// synthesises its own phases: its waveform has no sharp peak against the
// input, so its RMS envelopes (20 ms windows) are correlated instead, whose
// peak is blurred by the codec's interpolation of parameters between frames;
// the tolerance (kCodec2LagTolerance) is well under the 80-sample subframe
// that a wrong delay would be off by at least.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "data/audio.h"
#include "engine/core/error.h"
#include "tool/classic_codec.h"
#include "tool/eval.h"  // snr_db
#include "tests/train/small_run.h"  // sanitized_build

using namespace vqddp;

namespace {

constexpr const char* kCodecClipDir = "/usr/share/asterisk/sounds/en_US_f_Allison";

// 30 s of one speaker's prompts at 8 kHz; its first 15 s in sanitized
// builds (the alignment searches run instrumented there, about 40 s a case).
const Audio& clip() {
  static const Audio a = [] {
    Audio r = read_audio(std::string(kCodecClipDir) + "/demo-congrats.wav");
    if (test::sanitized_build()) r.samples.resize(std::min<size_t>(r.samples.size(), 15 * 8000));
    return r;
  }();
  return a;
}

double seconds_of(const std::vector<float>& x, int rate) { return static_cast<double>(x.size()) / rate; }
double bitrate(const ClassicCoded& c, const std::vector<float>& x, int rate) { return c.bytes * 8.0 / seconds_of(x, rate); }

// The lag L in [-max_lag, max_lag] maximising sum_t a[t] * b[t + L],
// normalised by the overlap's energies.
int peak_lag(const std::vector<float>& a, const std::vector<float>& b, int max_lag) {
  int best = 0;
  double best_c = -1e300;
  for (int lag = -max_lag; lag <= max_lag; ++lag) {
    double s = 0, na = 0, nb = 0;
    for (size_t t = 0; t < a.size(); ++t) {
      const int64_t j = static_cast<int64_t>(t) + lag;
      if (j < 0 || j >= static_cast<int64_t>(b.size())) continue;
      s += double(a[t]) * b[j];
      na += double(a[t]) * a[t];
      nb += double(b[j]) * b[j];
    }
    const double c = s / std::sqrt(na * nb + 1e-30);
    if (c > best_c) best_c = c, best = lag;
  }
  return best;
}

// RMS over a centred window of 2 * half + 1 samples, mean removed.
std::vector<float> envelope(const std::vector<float>& x, int half) {
  std::vector<double> cum(x.size() + 1, 0.0);
  for (size_t i = 0; i < x.size(); ++i) cum[i + 1] = cum[i] + double(x[i]) * x[i];
  std::vector<float> e(x.size());
  double mean = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const size_t a = i >= size_t(half) ? i - half : 0, b = std::min(x.size(), i + half + 1);
    e[i] = static_cast<float>(std::sqrt((cum[b] - cum[a]) / double(b - a)));
    mean += e[i];
  }
  mean /= double(x.size());
  for (auto& v : e) v -= static_cast<float>(mean);
  return e;
}

std::vector<float> every(const std::vector<float>& x, int step) {
  std::vector<float> out;
  for (size_t i = 0; i < x.size(); i += step) out.push_back(x[i]);
  return out;
}

// How far (samples at 8 kHz) Codec 2's envelope peak may be from 0: its
// scatter over speech (tool/classic_codec.h: 160 to 179 where 160 is the
// structural delay) and not the 80 of a subframe.
constexpr int kCodec2LagTolerance = 24;

// Opus: the waveform's peak lag, in samples at `rate`.
int waveform_lag(const std::vector<float>& x, const std::vector<float>& y, int rate) {
  return peak_lag(x, y, rate / 100);  // +-10 ms
}

// Codec 2: the envelopes' peak lag, in samples at 8 kHz (the envelopes are
// taken at `rate` and compared at every (rate / 8000)th sample).
int envelope_lag_8k(const std::vector<float>& x, const std::vector<float>& y, int rate) {
  const int step = rate / 8000, half = rate / 100;  // 20 ms windows
  return peak_lag(every(envelope(x, half), step), every(envelope(y, half), step), 400);  // +-50 ms
}

}  // namespace

TEST_CASE("classic codec specs parse, and a codec or setting the library lacks is refused naming it") {
  ClassicCodecSpec o = parse_classic_codec("opus:6");
  CHECK(o.name == "opus");
  CHECK(o.setting == 6);
  CHECK(o.label() == "opus 6 kbit/s");
  ClassicCodecSpec c = parse_classic_codec("codec2:3200");
  CHECK(c.name == "codec2");
  CHECK(c.setting == 3200);
  CHECK(c.label() == "codec2 3200");
  ClassicCodecSpec c7 = parse_classic_codec("Codec2:700c");
  CHECK(c7.setting == 700);
  CHECK(c7.label() == "codec2 700C");
  CHECK(parse_classic_codec("codec2:450").label() == "codec2 450");
  CHECK(parse_classic_codec("opus:510").setting == 510);

  auto list = parse_classic_codecs("opus:6, opus:8,codec2:1300");
  REQUIRE(list.size() == 3);
  CHECK(list[0].label() == "opus 6 kbit/s");
  CHECK(list[1].label() == "opus 8 kbit/s");
  CHECK(list[2].label() == "codec2 1300");

  CHECK_THROWS_WITH_AS(parse_classic_codec("mp3:128"),
                       doctest::Contains("classic codec 'mp3:128': unknown codec 'mp3'; accepted: opus:KBPS"), Error);
  CHECK_THROWS_WITH_AS(parse_classic_codec("opus"), doctest::Contains("classic codec 'opus': not CODEC:SETTING"),
                       Error);
  CHECK_THROWS_WITH_AS(parse_classic_codec("opus:5"),
                       doctest::Contains("classic codec 'opus:5': opus takes a whole number of kbit/s from 6 to 510"),
                       Error);
  CHECK_THROWS_WITH_AS(parse_classic_codec("opus:511"), doctest::Contains("'opus:511'"), Error);
  CHECK_THROWS_WITH_AS(parse_classic_codec("opus:6.5"), doctest::Contains("not '6.5'"), Error);
  CHECK_THROWS_WITH_AS(parse_classic_codec("opus:6000"), doctest::Contains("not '6000'"), Error);
  CHECK_THROWS_WITH_AS(
      parse_classic_codec("codec2:3000"),
      doctest::Contains("classic codec 'codec2:3000': codec2 has no mode '3000' (modes: 3200, 2400, 1600, 1400, "
                        "1300, 1200, 700C, 450)"),
      Error);
  CHECK_THROWS_WITH_AS(parse_classic_codec("codec2:700"), doctest::Contains("codec2 has no mode '700'"), Error);
  CHECK_THROWS_WITH_AS(parse_classic_codec("codec2:"), doctest::Contains("codec2 has no mode ''"), Error);
  CHECK_THROWS_WITH_AS(parse_classic_codecs("opus:6,,codec2:3200"),
                       doctest::Contains("classic codecs 'opus:6,,codec2:3200': an empty item (item 2)"), Error);
  CHECK_THROWS_WITH_AS(parse_classic_codecs("opus:6,speex:8"), doctest::Contains("unknown codec 'speex'"), Error);
}

TEST_CASE("a classic codec refuses a bad rate and a non-finite sample") {
  ClassicCodecSpec o = parse_classic_codec("opus:8");
  CHECK_THROWS_WITH_AS(code_classic(o, {0.0f, 0.1f}, 0), doctest::Contains("opus 8 kbit/s: the sample rate must be"),
                       Error);
  CHECK_THROWS_WITH_AS(code_classic(parse_classic_codec("codec2:1300"), {0.0f, NAN, 0.1f}, 8000),
                       doctest::Contains("codec2 1300: sample 1 of the input is not finite"), Error);
  ClassicCoded empty = code_classic(o, {}, 8000);
  CHECK(empty.samples.empty());
  CHECK(empty.bytes == 0);
}

namespace {

// The checks common to both rates: length, bitrate, alignment, SNR. `x` is
// at `rate`; Codec 2 runs at 8 kHz, Opus at `rate` (8 and 16 kHz are Opus
// rates).
void check_codec(const std::string& s, const std::vector<float>& x, int rate) {
  CAPTURE(s);
  CAPTURE(rate);
  const ClassicCodecSpec spec = parse_classic_codec(s);
  const ClassicCoded c = code_classic(spec, x, rate);
  REQUIRE(c.samples.size() == x.size());
  const double seconds = seconds_of(x, rate);
  const double bps = bitrate(c, x, rate);
  const double snr = snr_db(x, c.samples);
  const ClassicCodecDelay delay = classic_codec_delay(spec, rate);
  if (spec.name == "opus") {
    CHECK(delay.rate == rate);
    const int lag = waveform_lag(x, c.samples, rate);
    MESSAGE(spec.label(), " at ", rate, " Hz: ", bps / 1000, " kbit/s (packets alone ",
            c.packet_bytes * 8.0 / seconds / 1000, "), SNR ", snr, " dB, waveform lag ", lag, ", delay ",
            delay.samples, ", ", c.seconds / seconds * 60, " s per minute of audio");
    // VBR: a clip's rate moves about the target; the 1-byte lengths add 0.4
    // kbit/s (50 packets a second).
    CHECK(bps > 0.65 * spec.setting * 1000);
    CHECK(bps < 1.5 * spec.setting * 1000);
    CHECK(c.bytes - c.packet_bytes == c.frames);  // packets under 252 bytes: a 1-byte length each
    CHECK(c.frames * (rate / 50) >= static_cast<int64_t>(x.size()) + delay.samples);
    CHECK(c.frames * (rate / 50) < static_cast<int64_t>(x.size()) + delay.samples + rate / 50);
    CHECK(std::abs(lag) <= 1);
    // A waveform codec: positive SNR once aligned; the same output a
    // millisecond late scores below 0 dB.
    CHECK(snr > (spec.setting >= 8 ? 6.0 : 4.0));
  } else {
    CHECK(delay.rate == 8000);
    const int lag = envelope_lag_8k(x, c.samples, rate);
    MESSAGE(spec.label(), " at ", rate, " Hz: ", bps, " b/s, SNR ", snr, " dB, envelope lag ", lag, ", delay ",
            delay.samples, ", ", c.seconds / seconds * 60, " s per minute of audio");
    // Exact bits: frames * bits a frame, in whole bytes; the frames cover
    // the input (resampled to 8 kHz) and the delay, and not a frame more.
    const int spf = spec.setting >= 2400 ? 160 : 320;  // 20 ms frames for 3200 and 2400, else 40 ms
    const int64_t n8 = std::llround(static_cast<double>(x.size()) * 8000 / rate);
    CHECK(c.frames * spf >= n8 + delay.samples);
    CHECK(c.frames * spf < n8 + delay.samples + spf);
    const double frame_bits = spec.setting * spf / 8000.0;  // 64 for 3200, 52 for 1300
    CHECK(c.bytes == static_cast<int64_t>(std::ceil(c.frames * frame_bits / 8)));
    CHECK(c.bytes == c.packet_bytes);
    // The nominal rate times the coded (padded) duration over the input's.
    CHECK(bps == doctest::Approx(spec.setting * (c.frames * spf / 8000.0) / seconds).epsilon(1e-3));
    CHECK(bps >= spec.setting);
    CHECK(bps < spec.setting * (1 + 2.0 * spf / 8000 / seconds));
    CHECK(std::abs(lag) <= kCodec2LagTolerance);
  }
}

}  // namespace

TEST_CASE("a classic codec codes speech at its bitrate, aligned with the input, at 8 kHz") {
  const Audio& a = clip();
  REQUIRE(a.sample_rate == 8000);
  REQUIRE(seconds_of(a.samples, 8000) >= (test::sanitized_build() ? 15 : 25));
  for (const char* s : {"opus:6", "opus:8", "codec2:3200", "codec2:1300"}) check_codec(s, a.samples, 8000);
}

TEST_CASE("a classic codec codes speech at 16 kHz too, back at 16 kHz and aligned") {
  const std::vector<float> x = resample(clip().samples, 8000, 16000);
  for (const char* s : {"opus:6", "opus:8", "codec2:3200", "codec2:1300"}) check_codec(s, x, 16000);
}

TEST_CASE("a classic codec at a rate Opus lacks runs Opus at 48 kHz, back at the input's rate and aligned") {
  // 5 s of the clip at 44.1 kHz (the waveform cross-correlation over +-10 ms
  // is quadratic in the rate).
  const std::vector<float>& c = clip().samples;
  const std::vector<float> x = resample(std::vector<float>(c.begin(), c.begin() + 5 * 8000), 8000, 44100);
  const ClassicCodecSpec spec = parse_classic_codec("opus:8");
  const ClassicCodecDelay delay = classic_codec_delay(spec, 44100);
  CHECK(delay.rate == 48000);
  CHECK(delay.samples == 312);  // 6.5 ms: 2.5 ms of lookahead and 4 ms of delay compensation
  const ClassicCoded o = code_classic(spec, x, 44100);
  REQUIRE(o.samples.size() == x.size());
  CHECK(std::abs(waveform_lag(x, o.samples, 44100)) <= 1);
  CHECK(snr_db(x, o.samples) > 3.0);
  CHECK(o.frames == (static_cast<int64_t>(x.size()) * 48000 / 44100 + 312 + 959) / 960);
}

TEST_CASE("a classic codec's output a few samples off would fail the alignment checks") {
  // The checks above can see a misalignment: the aligned output shifted by
  // 1 ms (opus) and by a subframe (codec2) peaks away from 0.
  const std::vector<float>& x = clip().samples;
  const ClassicCoded o = code_classic(parse_classic_codec("opus:8"), x, 8000);
  std::vector<float> late(x.size(), 0.0f);
  std::copy(o.samples.begin(), o.samples.end() - 8, late.begin() + 8);
  CHECK(waveform_lag(x, late, 8000) == 8);
  CHECK(snr_db(x, late) < 0.5);
  const ClassicCoded c = code_classic(parse_classic_codec("codec2:3200"), x, 8000);
  std::vector<float> c_late(x.size(), 0.0f);
  std::copy(c.samples.begin(), c.samples.end() - 80, c_late.begin() + 80);
  CHECK(std::abs(envelope_lag_8k(x, c_late, 8000)) > kCodec2LagTolerance);
}
