// STOI and ESTOI (train/stoi.h) by properties that need no other
// implementation: a signal against itself scores 1, the degraded signal's
// scale does not matter, more noise scores lower; against a slow, literal
// transcription of the papers' equations written here (a direct DFT, loops
// over bands and segments, nothing shared with train/stoi.cpp); the
// shortest clip that has a score; and the clear errors (or, from
// stoi_if_scorable, no score) for what has none.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <filesystem>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "data/audio.h"
#include "engine/core/error.h"
#include "train/stoi.h"

using namespace vqddp;

namespace {

constexpr const char* kSpeechDir = "/usr/share/asterisk/sounds/en_US_f_Allison";

// A few seconds of real speech at 8 kHz: 5 asterisk prompts (in name
// order) one after the other.
std::vector<float> speech() {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(kSpeechDir))
    if (e.path().extension() == ".wav") names.push_back(e.path().string());
  std::sort(names.begin(), names.end());
  REQUIRE(names.size() >= 5);
  std::vector<float> out;
  for (size_t i = 0; i < 5; ++i) {
    Audio a = read_audio(names[i]);
    REQUIRE(a.sample_rate == 8000);
    out.insert(out.end(), a.samples.begin(), a.samples.end());
  }
  return out;
}

// Unit-variance white noise, the same for a seed.
std::vector<double> white_noise(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<double> v(n);
  for (auto& s : v) s = normal(rng);
  return v;
}

// x plus `noise` scaled to `snr_db` below x's mean power.
std::vector<float> add_noise(const std::vector<float>& x, const std::vector<double>& noise, double snr_db) {
  double px = 0, pn = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    px += double(x[i]) * x[i];
    pn += noise[i] * noise[i];
  }
  const double gain = std::sqrt(px / pn / std::pow(10.0, snr_db / 10));
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = static_cast<float>(x[i] + gain * noise[i]);
  return y;
}

// Speech-like and synthetic: a 120 Hz voice with 12 harmonics whose pitch
// glides, amplitude-modulated at a syllable rate of 4 Hz, plus a little
// noise, at `rate` for `seconds`.
std::vector<float> synthetic_speech(int rate, double seconds) {
  const size_t n = static_cast<size_t>(rate * seconds);
  std::vector<double> noise = white_noise(n, 7);
  std::vector<float> x(n);
  double phase = 0;
  for (size_t i = 0; i < n; ++i) {
    const double t = double(i) / rate;
    phase += 2 * std::numbers::pi * (120 + 30 * std::sin(2 * std::numbers::pi * 0.7 * t)) / rate;
    double v = 0;
    for (int h = 1; h <= 12; ++h) v += std::sin(h * phase) / h;
    const double envelope = 0.55 + 0.45 * std::sin(2 * std::numbers::pi * 4 * t);
    x[i] = static_cast<float>(0.2 * envelope * v + 0.005 * noise[i]);
  }
  return x;
}

// ---------------------------------------------------------------------------
// The papers' equations, written out as slowly and literally as they read,
// at 10 kHz. Taal et al. 2011, section II; Jensen and Taal 2016, section III;
// the framing, window, band edges and silent-frame removal as in the
// authors' MATLAB reference.
struct Transcribed {
  double stoi = 0, estoi = 0;
  int frames_before = 0, frames_removed = 0, clipped = 0;
};

Transcribed transcription(const std::vector<double>& clean, const std::vector<double>& degraded) {
  const double fs = 10000, pi = std::numbers::pi;
  const int frame_len = 256, hop = 128, nfft = 512, J = 15, N = 30;
  const double beta = -15, dyn_range = 40, eps = 2.220446049250313e-16;
  Transcribed out;

  // MATLAB's hanning(256): 0.5 (1 - cos(2 pi n / 257)), n = 1..256.
  std::vector<double> w(frame_len);
  for (int n = 1; n <= frame_len; ++n) w[n - 1] = 0.5 * (1 - std::cos(2 * pi * n / (frame_len + 1)));
  // MATLAB's frames = 1:hop:(length - frame_len), here from 0.
  auto starts_of = [&](size_t length) {
    std::vector<int> s;
    for (int start = 0; start + frame_len < static_cast<int>(length); start += hop) s.push_back(start);
    return s;
  };

  // Silent frames: clean energy more than dyn_range below the loudest.
  std::vector<int> starts = starts_of(clean.size());
  out.frames_before = static_cast<int>(starts.size());
  std::vector<double> energy;
  for (int s : starts) {
    double e = 0;
    for (int n = 0; n < frame_len; ++n) e += (w[n] * clean[s + n]) * (w[n] * clean[s + n]);
    energy.push_back(20 * std::log10(std::sqrt(e) + eps));
  }
  double max_energy = -1e300;
  for (double e : energy) max_energy = std::max(max_energy, e);
  std::vector<double> x, y;
  int count = 0;
  for (size_t f = 0; f < starts.size(); ++f) {
    if (!(max_energy - dyn_range - energy[f] < 0)) {
      ++out.frames_removed;
      continue;
    }
    x.resize(count * hop + frame_len, 0.0);
    y.resize(count * hop + frame_len, 0.0);
    for (int n = 0; n < frame_len; ++n) {
      x[count * hop + n] += w[n] * clean[starts[f] + n];
      y[count * hop + n] += w[n] * degraded[starts[f] + n];
    }
    ++count;
  }

  // One-third octave bands: edges at the DFT bins nearest
  // 150 * 2^((2j - 1) / 6) and 150 * 2^((2j + 1) / 6).
  std::vector<int> lo(J), hi(J);
  for (int j = 0; j < J; ++j) {
    const double f_lo = 150 * std::pow(2.0, (2.0 * j - 1) / 6), f_hi = 150 * std::pow(2.0, (2.0 * j + 1) / 6);
    double best_lo = 1e300, best_hi = 1e300;
    for (int k = 0; k <= nfft / 2; ++k) {
      const double f = k * fs / nfft;
      if ((f - f_lo) * (f - f_lo) < best_lo) best_lo = (f - f_lo) * (f - f_lo), lo[j] = k;
      if ((f - f_hi) * (f - f_hi) < best_hi) best_hi = (f - f_hi) * (f - f_hi), hi[j] = k;
    }
  }

  // X_j(m) = sqrt(sum over the band's bins of |DFT|^2), the DFT direct.
  auto envelopes = [&](const std::vector<double>& s) {
    std::vector<int> st = starts_of(s.size());
    std::vector<std::vector<double>> env(J, std::vector<double>(st.size()));
    for (size_t m = 0; m < st.size(); ++m)
      for (int j = 0; j < J; ++j) {
        double power = 0;
        for (int k = lo[j]; k < hi[j]; ++k) {
          std::complex<double> X = 0;
          for (int n = 0; n < frame_len; ++n)
            X += w[n] * s[st[m] + n] * std::exp(std::complex<double>(0, -2 * pi * k * n / nfft));
          power += std::norm(X);
        }
        env[j][m] = std::sqrt(power);
      }
    return env;
  };
  const auto X = envelopes(x), Y = envelopes(y);
  const int M = static_cast<int>(X[0].size());
  REQUIRE(M >= N);

  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double a : v) s += a;
    return s / v.size();
  };
  auto norm = [](const std::vector<double>& v) {
    double s = 0;
    for (double a : v) s += a * a;
    return std::sqrt(s);
  };

  // STOI: d_j,m, the correlation of x_j,m with the normalised, clipped y.
  double d_sum = 0;
  for (int m = N; m <= M; ++m)
    for (int j = 0; j < J; ++j) {
      std::vector<double> xs(N), ys(N);
      for (int n = 0; n < N; ++n) xs[n] = X[j][m - N + n], ys[n] = Y[j][m - N + n];
      const double alpha = norm(xs) / norm(ys);
      for (int n = 0; n < N; ++n) {
        const double bound = (1 + std::pow(10.0, -beta / 20)) * xs[n];
        if (alpha * ys[n] > bound) ++out.clipped;
        ys[n] = std::min(alpha * ys[n], bound);
      }
      const double mx = mean(xs), my = mean(ys);
      for (int n = 0; n < N; ++n) xs[n] -= mx, ys[n] -= my;
      double dot = 0;
      for (int n = 0; n < N; ++n) dot += xs[n] * ys[n];
      d_sum += dot / (norm(xs) * norm(ys));
    }
  out.stoi = d_sum / (J * (M - N + 1));

  // ESTOI: rows then columns of each J x N segment to zero mean, unit norm;
  // d_m the mean over its columns of their inner products.
  auto normalise = [&](std::vector<std::vector<double>> S) {
    for (int j = 0; j < J; ++j) {
      const double mu = mean(S[j]);
      for (int n = 0; n < N; ++n) S[j][n] -= mu;
      const double r = norm(S[j]);
      for (int n = 0; n < N; ++n) S[j][n] /= r;
    }
    for (int n = 0; n < N; ++n) {
      std::vector<double> col(J);
      for (int j = 0; j < J; ++j) col[j] = S[j][n];
      const double mu = mean(col);
      for (int j = 0; j < J; ++j) col[j] -= mu;
      const double r = norm(col);
      for (int j = 0; j < J; ++j) S[j][n] = col[j] / r;
    }
    return S;
  };
  double e_sum = 0;
  for (int m = N; m <= M; ++m) {
    std::vector<std::vector<double>> xs(J, std::vector<double>(N)), ys(J, std::vector<double>(N));
    for (int j = 0; j < J; ++j)
      for (int n = 0; n < N; ++n) xs[j][n] = X[j][m - N + n], ys[j][n] = Y[j][m - N + n];
    xs = normalise(xs);
    ys = normalise(ys);
    double d_m = 0;
    for (int n = 0; n < N; ++n)
      for (int j = 0; j < J; ++j) d_m += xs[j][n] * ys[j][n] / N;
    e_sum += d_m;
  }
  out.estoi = e_sum / (M - N + 1);
  return out;
}

// A random clean and degraded pair at 10 kHz: noise shaped by a random
// two-pole filter under a random piecewise envelope whose quiet pieces
// (60 dB down) are removed as silent, degraded by an echo, noise that fills
// those pieces too, and a loud 30 ms burst of noise every 0.4 s (where the
// clipping bites).
std::pair<std::vector<float>, std::vector<float>> random_pair(uint64_t seed, size_t n) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(0, 1);
  std::normal_distribution<double> normal;
  const double r = 0.8 + 0.15 * uniform(rng), theta = std::numbers::pi * (0.05 + 0.3 * uniform(rng));
  std::vector<float> x(n), y(n);
  double s1 = 0, s2 = 0, level = 1;
  size_t piece_end = 0;
  int piece = 0;
  for (size_t i = 0; i < n; ++i) {
    if (i == piece_end) {
      piece_end = i + 800 + static_cast<size_t>(2500 * uniform(rng));
      level = (piece++ % 3 == 2) ? 1e-3 : 0.1 + uniform(rng);
    }
    const double s = normal(rng) + 2 * r * std::cos(theta) * s1 - r * r * s2;
    s2 = s1, s1 = s;
    x[i] = static_cast<float>(0.05 * level * s);
  }
  for (size_t i = 0; i < n; ++i)
    y[i] = static_cast<float>(x[i] + (i >= 40 ? 0.6 * x[i - 40] : 0) + (i % 4000 < 300 ? 0.1 : 0.01) * normal(rng));
  return {x, y};
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

}  // namespace

TEST_CASE("STOI and ESTOI of speech against itself are 1, for real and synthetic speech at several rates") {
  const std::vector<float> clip = speech();
  CHECK(stoi(clip, clip, 8000) == doctest::Approx(1).epsilon(1e-6));
  CHECK(stoi(clip, clip, 8000, true) == doctest::Approx(1).epsilon(1e-6));
  for (int rate : {10000, 16000, 44100}) {
    CAPTURE(rate);
    const std::vector<float> synth = synthetic_speech(rate, 2.0);
    CHECK(stoi(synth, synth, rate) == doctest::Approx(1).epsilon(1e-6));
    CHECK(stoi(synth, synth, rate, true) == doctest::Approx(1).epsilon(1e-6));
  }
}

TEST_CASE("STOI and ESTOI do not depend on the degraded signal's scale") {
  const std::vector<float> clean = speech();
  const std::vector<float> degraded = add_noise(clean, white_noise(clean.size(), 3), 5);
  for (bool extended : {false, true}) {
    CAPTURE(extended);
    const double base = stoi(clean, degraded, 8000, extended);
    CHECK(base > 0.3);
    CHECK(base < 0.99);
    for (float scale : {0.1f, 10.0f}) {
      CAPTURE(scale);
      std::vector<float> scaled(degraded);
      for (float& s : scaled) s *= scale;
      CHECK(std::abs(stoi(clean, scaled, 8000, extended) - base) < 1e-6);
    }
  }
}

TEST_CASE("STOI and ESTOI of speech in white noise fall strictly as the SNR falls from 20 dB to -5 dB") {
  const std::vector<float> clean = speech();
  const std::vector<double> noise = white_noise(clean.size(), 11);
  for (bool extended : {false, true}) {
    CAPTURE(extended);
    double previous = 1;
    for (double snr : {20, 15, 10, 5, 0, -5}) {
      CAPTURE(snr);
      const double score = stoi(clean, add_noise(clean, noise, snr), 8000, extended);
      CHECK(score < previous);
      CHECK(score > 0);
      previous = score;
    }
  }
}

TEST_CASE("STOI and ESTOI agree with a literal transcription of the papers' equations on random signals") {
  for (uint64_t seed : {1, 2, 3, 4}) {
    CAPTURE(seed);
    const auto [clean, degraded] = random_pair(seed, 16000 + 1000 * seed);
    const Transcribed ref = transcription(to_double(clean), to_double(degraded));
    // The signals exercise what they are for: silent frames are removed
    // (but not all), and the clipping bites.
    CHECK(ref.frames_removed > 0);
    CHECK(ref.frames_removed < ref.frames_before / 2);
    CHECK(ref.clipped > 0);
    CHECK(ref.stoi > 0.2);
    CHECK(ref.stoi < 0.99);
    CHECK(std::abs(stoi(clean, degraded, 10000) - ref.stoi) < 1e-6);
    CHECK(std::abs(stoi(clean, degraded, 10000, true) - ref.estoi) < 1e-6);
  }
  SUBCASE("at 8 kHz, resampled to 10 kHz first") {
    const auto [clean, degraded] = random_pair(5, 14000);
    const Transcribed ref =
        transcription(to_double(resample(clean, 8000, 10000)), to_double(resample(degraded, 8000, 10000)));
    CHECK(std::abs(stoi(clean, degraded, 8000) - ref.stoi) < 1e-6);
    CHECK(std::abs(stoi(clean, degraded, 8000, true) - ref.estoi) < 1e-6);
  }
}

TEST_CASE("STOI needs stoi_min_samples of non-silent audio: one sample fewer is refused") {
  CHECK(stoi_min_samples(10000) == 4097);
  for (int rate : {8000, 10000, 16000, 22050}) {
    CAPTURE(rate);
    const int64_t need = stoi_min_samples(rate);
    std::vector<double> noise = white_noise(static_cast<size_t>(need), 5);
    std::vector<float> clip(noise.begin(), noise.end());
    for (float& s : clip) s *= 0.1f;
    std::vector<float> degraded = add_noise(clip, white_noise(clip.size(), 6), 0);
    CHECK(std::isfinite(stoi(clip, degraded, rate)));
    clip.pop_back();
    degraded.pop_back();
    CHECK_THROWS_WITH_AS(stoi(clip, degraded, rate), doctest::Contains("shorter than one STOI segment (384 ms)"),
                         Error);
  }
}

TEST_CASE("STOI refuses what has no score, with a message that says why") {
  const std::vector<float> clip = synthetic_speech(8000, 1.0);
  CHECK_THROWS_WITH_AS(stoi(clip, std::vector<float>(clip.begin(), clip.end() - 1), 8000),
                       doctest::Contains("must have the same length, got 8000 and 7999 samples"), Error);
  const std::vector<float> short_clip = synthetic_speech(8000, 0.2);
  CHECK_THROWS_WITH_AS(stoi(short_clip, short_clip, 8000, true),
                       doctest::Contains("a clip of 0.20 s (1600 samples at 8000 Hz) is shorter than one STOI segment "
                                         "(384 ms)"),
                       Error);
  CHECK_THROWS_WITH_AS(stoi({}, {}, 8000), doctest::Contains("a clip of 0.00 s"), Error);
  const std::vector<float> silence(16000, 0.0f);
  CHECK_THROWS_WITH_AS(stoi(silence, std::vector<float>(16000, 0.1f), 8000),
                       doctest::Contains("the clean signal is silent"), Error);
  // Long enough, but only 0.2 s of it is not silence.
  std::vector<float> mostly_silent(16000, 0.0f);
  std::copy(short_clip.begin(), short_clip.end(), mostly_silent.begin() + 4000);
  CHECK_THROWS_WITH_AS(stoi(mostly_silent, mostly_silent, 8000),
                       doctest::Contains("a clip of 2.00 s keeps"), Error);
  for (int rate : {0, -8000}) {
    CAPTURE(rate);
    const std::string what = "sample rate must be positive, got " + std::to_string(rate) + " Hz";
    CHECK_THROWS_WITH_AS(stoi(clip, clip, rate), doctest::Contains(what.c_str()), Error);
    CHECK_THROWS_WITH_AS(stoi_min_samples(rate), doctest::Contains("sample rate must be positive"), Error);
  }
  // stoi_if_scorable: no score where stoi refuses the clip, the same score
  // elsewhere, and the same errors for bad arguments.
  CHECK_FALSE(stoi_if_scorable(short_clip, short_clip, 8000).has_value());
  CHECK_FALSE(stoi_if_scorable(silence, silence, 8000).has_value());
  CHECK_FALSE(stoi_if_scorable(mostly_silent, mostly_silent, 8000, true).has_value());
  const std::vector<float> noisy = add_noise(clip, white_noise(clip.size(), 4), 0);
  CHECK(stoi_if_scorable(clip, noisy, 8000, true).value() == stoi(clip, noisy, 8000, true));
  CHECK_THROWS_WITH_AS(stoi_if_scorable(clip, short_clip, 8000), doctest::Contains("got 8000 and 1600 samples"),
                       Error);
  std::vector<float> bad(clip);
  bad[123] = std::nanf("");
  CHECK_THROWS_WITH_AS(stoi(clip, bad, 8000), doctest::Contains("the degraded signal's sample 123 is not finite"),
                       Error);
}
