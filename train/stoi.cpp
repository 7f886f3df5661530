#include "train/stoi.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <complex>
#include <limits>
#include <numbers>
#include <optional>
#include <string>

#include "data/audio.h"
#include "engine/core/error.h"
#include "train/fft.h"

namespace vqddp {

namespace {

constexpr int kRate = 10000;     // Hz: the measure's rate
constexpr int kFrame = 256;      // samples per frame (25.6 ms)
constexpr int kHop = 128;        // half a frame
constexpr int kFft = 512;        // DFT points (the frame zero-padded)
constexpr int kBands = kThirdOctaveBands;
constexpr double kLowestCentre = 150;  // Hz
constexpr int kSegment = 30;     // frames per segment (384 ms)
constexpr double kBeta = -15;    // dB: the clipping's signal-to-distortion floor
constexpr double kDynamicRange = 40;  // dB: frames further below the loudest are silent
// The reference's guard against 0 / 0 (numpy's float eps).
constexpr double kEps = std::numeric_limits<double>::epsilon();

// hanning(258)[1:-1]: the 258-point Hann window without its zero ends.
const std::array<double, kFrame>& window() {
  static const std::array<double, kFrame> w = [] {
    std::array<double, kFrame> w{};
    for (int n = 0; n < kFrame; ++n) w[n] = 0.5 - 0.5 * std::cos(2 * std::numbers::pi * (n + 1) / (kFrame + 1));
    return w;
  }();
  return w;
}

// The reference's frames of a signal of `length` samples: starts 0, kHop,
// ... below length - kFrame (none when length <= kFrame).
int64_t frame_count(int64_t length) { return length > kFrame ? (length - kFrame - 1) / kHop + 1 : 0; }

// [lo, hi) DFT bins of each band: each edge rounded to the nearest bin
// (the first of two equally near, as the reference's argmin).
struct Band {
  int lo, hi;
};
const std::array<Band, kBands>& bands() {
  static const std::array<Band, kBands> b = [] {
    std::array<Band, kBands> b{};
    for (int j = 0; j < kBands; ++j) {
      const BinRange r = third_octave_bins(j, kRate, kFft);
      b[j] = {static_cast<int>(r.lo), static_cast<int>(r.hi)};
    }
    return b;
  }();
  return b;
}

// Step 2, decided by the clean signal alone: the frames whose energy is
// within kDynamicRange dB of the loudest. `total` frames in all; `silent`
// when every one of them is all zeros.
std::vector<int64_t> loud_frames(const std::vector<double>& x, int64_t& total, bool& silent) {
  const auto& w = window();
  total = frame_count(static_cast<int64_t>(x.size()));
  std::vector<double> energy(static_cast<size_t>(total));
  double loudest_norm = 0;
  for (int64_t f = 0; f < total; ++f) {
    double sum = 0;
    for (int n = 0; n < kFrame; ++n) {
      double v = w[n] * x[f * kHop + n];
      sum += v * v;
    }
    loudest_norm = std::max(loudest_norm, std::sqrt(sum));
    energy[f] = 20 * std::log10(std::sqrt(sum) + kEps);
  }
  // Every frame of a silent clean signal has the same energy, so none would
  // be removed and every score would be 0: no score instead (stoi.h).
  silent = total > 0 && loudest_norm == 0;
  const double loudest = total ? *std::max_element(energy.begin(), energy.end()) : 0;
  std::vector<int64_t> keep;
  for (int64_t f = 0; f < total; ++f)
    if (loudest - kDynamicRange - energy[f] < 0) keep.push_back(f);  // the reference's test, strict
  return keep;
}

// The rest of step 2, for either signal: the kept frames, windowed and
// overlap-added.
std::vector<double> overlap_add(const std::vector<double>& x, const std::vector<int64_t>& keep) {
  const auto& w = window();
  const int64_t kept = static_cast<int64_t>(keep.size());
  std::vector<double> out(keep.empty() ? 0 : static_cast<size_t>((kept - 1) * kHop + kFrame), 0.0);
  for (int64_t i = 0; i < kept; ++i)
    for (int n = 0; n < kFrame; ++n) out[i * kHop + n] += w[n] * x[keep[i] * kHop + n];
  return out;
}

// Steps 3 and 4: the band envelopes of a signal, [band][frame].
std::vector<std::vector<double>> band_envelopes(const std::vector<double>& x) {
  // A 512-point FFT per frame costs 2304 butterflies instead of the 131072
  // products of a direct DFT (256 samples by 512 bins).
  static const Fft fft(kFft);
  const auto& w = window();
  const auto& b = bands();
  const int64_t frames = frame_count(static_cast<int64_t>(x.size()));
  std::vector<std::vector<double>> env(kBands, std::vector<double>(static_cast<size_t>(frames)));
  // Two real frames a transform (train/fft.h): frame f as the real part,
  // frame f + 1 as the imaginary.
  std::array<std::complex<double>, kFft> buf;
  for (int64_t f = 0; f < frames; f += 2) {
    const bool pair = f + 1 < frames;
    for (int n = 0; n < kFrame; ++n)
      buf[n] = {w[n] * x[f * kHop + n], pair ? w[n] * x[(f + 1) * kHop + n] : 0.0};
    std::fill(buf.begin() + kFrame, buf.end(), 0.0);
    fft(buf.data());
    for (int j = 0; j < kBands; ++j) {
      double even = 0, odd = 0;
      for (int k = b[j].lo; k < b[j].hi; ++k) {
        const auto [pe, po] = fft.split_power(buf.data(), k);
        even += pe;
        odd += po;
      }
      env[j][f] = std::sqrt(even);
      if (pair) env[j][f + 1] = std::sqrt(odd);
    }
  }
  return env;
}

double norm_of(const double* v, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += v[i] * v[i];
  return std::sqrt(s);
}

// Zero mean, then divided by norm + kEps, in place.
void standardise(double* v, int n, int stride) {
  double mean = 0;
  for (int i = 0; i < n; ++i) mean += v[i * stride];
  mean /= n;
  double s = 0;
  for (int i = 0; i < n; ++i) {
    v[i * stride] -= mean;
    s += v[i * stride] * v[i * stride];
  }
  const double scale = 1 / (std::sqrt(s) + kEps);
  for (int i = 0; i < n; ++i) v[i * stride] *= scale;
}

// Step 5, STOI: the mean over segments and bands of the correlation of the
// clean envelope with the scaled and clipped degraded one.
double stoi_score(const std::vector<std::vector<double>>& X, const std::vector<std::vector<double>>& Y, int64_t frames) {
  const double clip = 1 + std::pow(10.0, -kBeta / 20);
  double total = 0;
  std::array<double, kSegment> x, y;
  for (int64_t end = kSegment; end <= frames; ++end)
    for (int j = 0; j < kBands; ++j) {
      std::copy_n(X[j].begin() + (end - kSegment), kSegment, x.begin());
      std::copy_n(Y[j].begin() + (end - kSegment), kSegment, y.begin());
      const double alpha = norm_of(x.data(), kSegment) / (norm_of(y.data(), kSegment) + kEps);
      for (int n = 0; n < kSegment; ++n) y[n] = std::min(alpha * y[n], clip * x[n]);
      standardise(x.data(), kSegment, 1);
      standardise(y.data(), kSegment, 1);
      double dot = 0;
      for (int n = 0; n < kSegment; ++n) dot += x[n] * y[n];
      total += dot;
    }
  return total / (static_cast<double>(frames - kSegment + 1) * kBands);
}

// Step 5, ESTOI: the mean over segments of the mean over frames of the inner
// products of the row- then column-normalised envelope matrices' columns.
double estoi_score(const std::vector<std::vector<double>>& X, const std::vector<std::vector<double>>& Y,
                   int64_t frames) {
  double total = 0;
  std::array<double, kBands * kSegment> x, y;  // [band][frame] within the segment
  for (int64_t end = kSegment; end <= frames; ++end) {
    for (int j = 0; j < kBands; ++j) {
      std::copy_n(X[j].begin() + (end - kSegment), kSegment, x.begin() + j * kSegment);
      std::copy_n(Y[j].begin() + (end - kSegment), kSegment, y.begin() + j * kSegment);
      standardise(x.data() + j * kSegment, kSegment, 1);
      standardise(y.data() + j * kSegment, kSegment, 1);
    }
    for (int n = 0; n < kSegment; ++n) {
      standardise(x.data() + n, kBands, kSegment);
      standardise(y.data() + n, kBands, kSegment);
    }
    double dot = 0;
    for (int i = 0; i < kBands * kSegment; ++i) dot += x[i] * y[i];
    total += dot / kSegment;
  }
  return total / static_cast<double>(frames - kSegment + 1);
}

}  // namespace

int64_t stoi_min_samples(int rate) {
  VQDDP_CHECK(rate > 0, "stoi: the sample rate must be positive, got {} Hz", rate);
  // 4097 samples at kRate (stoi.h); resample gives round(n * kRate / rate)
  // samples for n at `rate`, so the fewest n whose rounding reaches 4097.
  const int64_t need = int64_t(kSegment) * kHop + kFrame + 1;
  int64_t n = std::max<int64_t>(1, static_cast<int64_t>(std::floor((need - 1) * double(rate) / kRate)) - 2);
  while (std::llround(static_cast<double>(n) * kRate / rate) < need) ++n;
  return n;
}

static void check_signal(const std::vector<float>& v, const char* which) {
  for (size_t i = 0; i < v.size(); ++i)
    VQDDP_CHECK(std::isfinite(v[i]), "stoi: the {} signal's sample {} is not finite ({})", which, i, v[i]);
}

StoiReference::StoiReference(const std::vector<float>& clean, int rate) : rate_(rate), length_(clean.size()) {
  VQDDP_CHECK(rate > 0, "stoi: the sample rate must be positive, got {} Hz", rate);
  check_signal(clean, "clean");
  const double seconds = static_cast<double>(clean.size()) / rate;
  if (static_cast<int64_t>(clean.size()) < stoi_min_samples(rate)) {
    why_ = fmt::format("stoi: a clip of {:.2f} s ({} samples at {} Hz) is shorter than one STOI segment (384 ms): a "
                       "score needs at least {} samples ({:.2f} s)",
                       seconds, clean.size(), rate, stoi_min_samples(rate),
                       static_cast<double>(stoi_min_samples(rate)) / rate);
    return;
  }
  const std::vector<float> x10 = resample(clean, rate, kRate);
  const std::vector<double> x(x10.begin(), x10.end());
  int64_t total = 0;
  bool silent = false;
  keep_ = loud_frames(x, total, silent);
  if (silent) {
    why_ = "stoi: the clean signal is silent (every frame of it is all zeros): intelligibility against it is undefined";
    return;
  }
  const std::vector<double> xs = overlap_add(x, keep_);
  frames_ = frame_count(static_cast<int64_t>(xs.size()));
  if (frames_ < kSegment) {
    why_ = fmt::format("stoi: a clip of {:.2f} s keeps {} of its {} frames after silent-frame removal (frames more "
                       "than {} dB below its loudest), {} STFT frames: fewer than one STOI segment of {} frames "
                       "(384 ms)",
                       seconds, keep_.size(), total, kDynamicRange, frames_, kSegment);
    return;
  }
  envelopes_ = band_envelopes(xs);
}

StoiReference::Scores StoiReference::score(const std::vector<float>& degraded) const {
  VQDDP_CHECK(length_ == degraded.size(),
              "stoi: the clean and degraded signals must have the same length, got {} and {} samples", length_,
              degraded.size());
  check_signal(degraded, "degraded");
  if (!scorable()) VQDDP_THROW("{}", why_);
  const std::vector<float> y10 = resample(degraded, rate_, kRate);
  const auto Y = band_envelopes(overlap_add(std::vector<double>(y10.begin(), y10.end()), keep_));
  return {stoi_score(envelopes_, Y, frames_), estoi_score(envelopes_, Y, frames_)};
}

double stoi(const std::vector<float>& clean, const std::vector<float>& degraded, int rate, bool extended) {
  const StoiReference::Scores s = StoiReference(clean, rate).score(degraded);
  return extended ? s.estoi : s.stoi;
}

std::optional<double> stoi_if_scorable(const std::vector<float>& clean, const std::vector<float>& degraded, int rate,
                                       bool extended) {
  const StoiReference reference(clean, rate);
  if (!reference.scorable()) {
    // The arguments are still checked, as stoi() checks them.
    VQDDP_CHECK(clean.size() == degraded.size(),
                "stoi: the clean and degraded signals must have the same length, got {} and {} samples", clean.size(),
                degraded.size());
    check_signal(degraded, "degraded");
    return std::nullopt;
  }
  const StoiReference::Scores s = reference.score(degraded);
  return extended ? s.estoi : s.stoi;
}

BinRange third_octave_bins(int band, double rate, int64_t n_fft) {
  VQDDP_CHECK(band >= 0 && rate > 0 && n_fft >= 2, "third_octave_bins: band {} at {} Hz with {} points", band, rate,
              n_fft);
  auto nearest_bin = [&](double hz) {
    int64_t best = 0;
    for (int64_t k = 1; k <= n_fft / 2; ++k)
      if (std::abs(k * rate / n_fft - hz) < std::abs(best * rate / n_fft - hz)) best = k;
    return best;
  };
  const double centre = kLowestCentre * std::pow(2.0, band / 3.0);
  return {nearest_bin(centre * std::pow(2.0, -1.0 / 6)), nearest_bin(centre * std::pow(2.0, 1.0 / 6))};
}

}  // namespace vqddp
