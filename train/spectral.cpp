#include "train/spectral.h"


#include <algorithm>
#include <cmath>
#include <numbers>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "vq/losses.h"

namespace vqddp {

namespace {

constexpr float kMagnitudeEps = 1e-7f;  // under the sqrt
constexpr float kLogEps = 1e-5f;        // under the logs of the loss and the log-mel

std::pair<int, int> device_key(Device d) { return {static_cast<int>(d.kind), d.index}; }

// [2 * bins, 1, n_fft]: row k is w[n] cos(2 pi k n / n_fft), row bins + k is
// -w[n] sin(2 pi k n / n_fft) (the DFT's sign; the magnitude ignores it),
// with w the periodic Hann window 0.5 - 0.5 cos(2 pi n / n_fft). Computed in
// double and rounded once, so every run and device starts from the same bits.
Tensor stft_kernels(int64_t n_fft) {
  const int64_t bins = n_fft / 2 + 1;
  const double two_pi = 2 * std::numbers::pi;
  std::vector<float> k(static_cast<size_t>(2 * bins * n_fft));
  for (int64_t n = 0; n < n_fft; ++n) {
    double w = 0.5 - 0.5 * std::cos(two_pi * n / n_fft);
    for (int64_t f = 0; f < bins; ++f) {
      // (f * n) mod n_fft keeps the angle in [0, 2 pi): exact for large n_fft.
      double angle = two_pi * static_cast<double>((f * n) % n_fft) / n_fft;
      k[f * n_fft + n] = static_cast<float>(w * std::cos(angle));
      k[(bins + f) * n_fft + n] = static_cast<float>(-w * std::sin(angle));
    }
  }
  return from_vector(k, {2 * bins, 1, n_fft});
}

double hz_to_mel(double f) { return 2595.0 * std::log10(1.0 + f / 700.0); }
double mel_to_hz(double m) { return 700.0 * (std::pow(10.0, m / 2595.0) - 1.0); }

// [bins, n_mels] triangular filters as torchaudio.functional.melscale_fbanks
// (mel_scale="htk", norm=None, f_min 0, f_max sample_rate / 2): filter m
// rises from corner m to m + 1 and falls to m + 2, the n_mels + 2 corners
// evenly spaced in mel.
Tensor mel_filterbank(double sample_rate, int64_t n_fft, int64_t n_mels) {
  const int64_t bins = n_fft / 2 + 1;
  const double top = hz_to_mel(sample_rate / 2);
  std::vector<double> corners(static_cast<size_t>(n_mels + 2));
  for (int64_t i = 0; i < n_mels + 2; ++i) corners[i] = mel_to_hz(top * static_cast<double>(i) / (n_mels + 1));
  std::vector<float> fb(static_cast<size_t>(bins * n_mels), 0.f);
  for (int64_t m = 0; m < n_mels; ++m) {
    double lo = corners[m], mid = corners[m + 1], hi = corners[m + 2];
    bool covered = false;
    for (int64_t b = 0; b < bins; ++b) {
      double f = sample_rate * static_cast<double>(b) / n_fft;
      double v = std::max(0.0, std::min((f - lo) / (mid - lo), (hi - f) / (hi - mid)));
      fb[b * n_mels + m] = static_cast<float>(v);
      covered = covered || v > 0;
    }
    VQDDP_CHECK(covered, "LogMel: mel filter {} ({:.1f} to {:.1f} Hz) covers no STFT bin: n_mels {} is too many for "
                "n_fft {} at sample rate {} (bins are {:.1f} Hz apart); use fewer mels or a larger n_fft",
                m, lo, hi, n_mels, n_fft, sample_rate, sample_rate / n_fft);
  }
  return from_vector(fb, {bins, n_mels});
}

// The cached constant on `device`, copied there from the host entry (which
// the constructors add) on first use. The copy has no history and never
// requires grad.
Tensor cached_on(std::mutex& mu, std::map<std::pair<int, int>, Tensor>& cache, Device device) {
  std::lock_guard lock(mu);
  auto it = cache.find(device_key(device));
  if (it == cache.end()) {
    NoGradGuard no_grad;
    Tensor host = cache.at(device_key(Device::cpu()));
    it = cache.emplace(device_key(device), host.to(device).detach()).first;
  }
  return it->second;
}

// |log(|X| + eps) - log(|Y| + eps)| elementwise: the loss's and the
// distance's log term.
Tensor log_magnitude_error(const Tensor& mx, const Tensor& my) {
  return abs(sub(log(add(mx, kLogEps)), log(add(my, kLogEps))));
}

void check_waveforms(const char* what, const Tensor& x) {
  VQDDP_CHECK(x.defined() && x.dim() == 2 && x.dtype() == DType::f32, "{}: waveforms must be float32 [N, L], got {}",
              what, x.defined() ? x.desc() : "an undefined tensor");
}

}  // namespace

// ---- Stft ------------------------------------------------------------------------

Stft::Stft(int64_t n_fft, int64_t hop) : n_fft_(n_fft), hop_(hop), cache_(std::make_shared<Cache>()) {
  VQDDP_CHECK(n_fft >= 2, "Stft: n_fft must be at least 2, got {}", n_fft);
  VQDDP_CHECK(hop >= 1, "Stft: hop must be at least 1, got {} (n_fft {})", hop, n_fft);
  cache_->kernels.emplace(device_key(Device::cpu()), stft_kernels(n_fft));
}

int64_t Stft::frames(int64_t length) const {
  VQDDP_CHECK(length >= n_fft_, "Stft: signal length L = {} is shorter than one frame (n_fft = {}); use L >= n_fft",
              length, n_fft_);
  return (length - n_fft_) / hop_ + 1;
}

Tensor Stft::kernels_on(Device device) const { return cached_on(cache_->mu, cache_->kernels, device); }

Tensor Stft::complex(const Tensor& x) const {
  check_waveforms("Stft::complex", x);
  const int64_t n = x.size(0), t = frames(x.size(1)), b = bins();
  if (n == 0) return mul(reshape(sum(x), {1, 1, 1, 1}), zeros({0, 2, b, t}, DType::f32, x.device()));
  // [N, 2B, T]: real parts in channels [0, B), imaginary in [B, 2B), viewed
  // as [N, 2, B, T] with no channel slicing (which would cost copies).
  Conv1dOptions o;
  o.stride = hop_;
  Tensor parts = conv1d(reshape(x, {n, 1, x.size(1)}), kernels_on(x.device()), Tensor(), o);
  return reshape(parts, {n, 2, b, t});
}

Tensor Stft::magnitude(const Tensor& x) const {
  // re^2 + im^2: the sum of the squared channels.
  return sqrt(add(sum(square(complex(x)), 1), kMagnitudeEps));
}

// ---- MultiResolutionStftLoss ---------------------------------------------------------

MultiResolutionStftLoss::MultiResolutionStftLoss(std::vector<std::pair<int64_t, int64_t>> resolutions) {
  VQDDP_CHECK(!resolutions.empty(), "MultiResolutionStftLoss: needs at least one (n_fft, hop) resolution");
  for (auto [n_fft, hop] : resolutions) stfts_.emplace_back(n_fft, hop);
}

Tensor MultiResolutionStftLoss::operator()(const Tensor& x, const Tensor& y, Communicator& comm) const {
  check_waveforms("MultiResolutionStftLoss (reference x)", x);
  check_waveforms("MultiResolutionStftLoss (reconstruction y)", y);
  VQDDP_CHECK(x.shape() == y.shape() && x.device() == y.device(),
              "MultiResolutionStftLoss: reference {} and reconstruction {} must have one shape and device", x.desc(),
              y.desc());
  // Checked for every N, so a rank with no rows fails exactly like the others.
  for (const Stft& s : stfts_)
    VQDDP_CHECK(x.size(1) >= s.n_fft(), "MultiResolutionStftLoss: resolution n_fft = {} (hop {}) is longer than the "
                "signal, L = {}; use L >= n_fft", s.n_fft(), s.hop(), x.size(1));
  Tensor total;
  for (const Stft& s : stfts_) {
    Tensor mx = s.magnitude(x), my = s.magnitude(y);  // (N, bins, frames)
    Tensor term = add(mean_or_zero(log_magnitude_error(mx, my), comm), mean_or_zero(abs(sub(mx, my)), comm));
    total = total.defined() ? add(total, term) : term;
  }
  return div(total, static_cast<float>(stfts_.size()));
}

// ---- MultiResolutionMelLoss ------------------------------------------------------------

MultiResolutionMelLoss::MultiResolutionMelLoss(double sample_rate, const std::vector<std::array<int64_t, 3>>& mels) {
  VQDDP_CHECK(!mels.empty(), "MultiResolutionMelLoss: needs at least one (n_fft, hop, n_mels) resolution");
  for (auto [n_fft, hop, n_mels] : mels) mels_.push_back(std::make_shared<const LogMel>(sample_rate, n_fft, hop, n_mels));
}

Tensor MultiResolutionMelLoss::operator()(const Tensor& x, const Tensor& y, Communicator& comm) const {
  check_waveforms("MultiResolutionMelLoss (reference x)", x);
  check_waveforms("MultiResolutionMelLoss (reconstruction y)", y);
  Tensor total;
  for (const auto& mel : mels_) {
    mel->stft().frames(x.size(1));  // a short signal fails with every N
    Tensor term = mean_or_zero(abs(sub((*mel)(x), (*mel)(y))), comm);
    total = total.defined() ? add(total, term) : term;
  }
  return div(total, static_cast<float>(mels_.size()));
}

// ---- LogMel ----------------------------------------------------------------------------

LogMel::LogMel(double sample_rate, int64_t n_fft, int64_t hop, int64_t n_mels)
    : stft_(n_fft, hop), n_mels_(n_mels), cache_(std::make_shared<Cache>()) {
  VQDDP_CHECK(std::isfinite(sample_rate) && sample_rate > 0, "LogMel: sample rate must be positive, got {}",
              sample_rate);
  VQDDP_CHECK(n_mels >= 1, "LogMel: n_mels must be at least 1, got {}", n_mels);
  filterbank_ = mel_filterbank(sample_rate, n_fft, n_mels);
  // [bins, n_mels] -> [n_mels, bins, 1]: transpose copies, then a view.
  cache_->weights.emplace(device_key(Device::cpu()), reshape(transpose(filterbank_), {n_mels, stft_.bins(), 1}));
}

Tensor LogMel::operator()(const Tensor& x) const {
  Tensor mag = stft_.magnitude(x);  // [N, bins, T]
  Tensor w = cached_on(cache_->mu, cache_->weights, x.device());
  // No rows: zeros that stay in x's graph, so a rank without rows runs the
  // same backward as the others (conv1d takes no empty batch).
  Tensor mel = x.size(0) == 0 ? mul(reshape(sum(mag), {1, 1, 1}), zeros({0, n_mels_, mag.size(2)}, DType::f32, x.device()))
                              : conv1d(mag, w, Tensor());
  return log(add(mel, kLogEps));
}

SumCount log_mel_l1(const LogMel& mel, const Tensor& x, const Tensor& y) {
  check_waveforms("log_mel_l1 (x)", x);
  check_waveforms("log_mel_l1 (y)", y);
  VQDDP_CHECK(x.shape() == y.shape() && x.device() == y.device(),
              "log_mel_l1: x {} and y {} must have one shape and device", x.desc(), y.desc());
  mel.stft().frames(x.size(1));  // a short signal fails with every N
  if (x.size(0) == 0) return {};
  NoGradGuard no_grad;
  return log_mel_l1_against(mel, mel(x), y);
}

SumCount log_mel_l1_against(const LogMel& mel, const Tensor& mel_x, const Tensor& y) {
  NoGradGuard no_grad;
  Tensor d = abs(sub(mel_x, mel(y)));
  return {static_cast<double>(sum(d).item<float>()), static_cast<double>(d.numel())};
}

SumCount stft_distance(const Stft& stft, const Tensor& x, const Tensor& y) {
  check_waveforms("stft_distance (x)", x);
  check_waveforms("stft_distance (y)", y);
  VQDDP_CHECK(x.shape() == y.shape() && x.device() == y.device(),
              "stft_distance: x {} and y {} must have one shape and device", x.desc(), y.desc());
  stft.frames(x.size(1));
  if (x.size(0) == 0) return {};
  NoGradGuard no_grad;
  return stft_distance_against(stft, stft.magnitude(x), y);
}

SumCount stft_distance_against(const Stft& stft, const Tensor& magnitude_x, const Tensor& y) {
  NoGradGuard no_grad;
  Tensor my = stft.magnitude(y);
  Tensor d = add(log_magnitude_error(magnitude_x, my), abs(sub(magnitude_x, my)));
  return {static_cast<double>(sum(d).item<float>()), static_cast<double>(d.numel())};
}

LogMel held_out_log_mel(double sample_rate) { return LogMel(sample_rate, 256, 64, 40); }

}  // namespace vqddp
