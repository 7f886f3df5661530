#include "train/spectral.h"


#include <algorithm>
#include <cmath>
#include <complex>
#include <numbers>
#include <optional>

#include "engine/autograd.h"
#include "engine/cpu/unary_loops.h"
#include "engine/kernel_math.h"
#include "engine/ops.h"
#include "train/fft.h"
#include "train/stoi.h"
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
double hann(int64_t n, int64_t n_fft) { return 0.5 - 0.5 * std::cos(2 * std::numbers::pi * n / n_fft); }

Tensor stft_kernels(int64_t n_fft) {
  const int64_t bins = n_fft / 2 + 1;
  const double two_pi = 2 * std::numbers::pi;
  std::vector<float> k(static_cast<size_t>(2 * bins * n_fft));
  for (int64_t n = 0; n < n_fft; ++n) {
    double w = hann(n, n_fft);
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

// Spectra [N, bins, T] summed into bands by a kernel-size-1 conv1d weight
// [bands, bins, 1] (LogMel's filters, StoiLoss's bands): [N, bands, T].
// No rows: zeros that stay in the spectra's graph, so a rank without rows
// runs the same backward as the others (conv1d takes no empty batch).
Tensor bands_of(const Tensor& spectra, const Tensor& w) {
  if (spectra.size(0) == 0)
    return mul(reshape(sum(spectra), {1, 1, 1}), zeros({0, w.size(0), spectra.size(2)}, DType::f32, spectra.device()));
  return conv1d(spectra, w, Tensor());
}

// |log(|X| + eps) - log(|Y| + eps)| elementwise: the loss's and the
// distance's log term.
Tensor log_magnitude_error(const Tensor& mx, const Tensor& my) {
  return abs(sub(log(add(mx, kLogEps)), log(add(my, kLogEps))));
}

// log(v + 1e-5) of every v, as the loss's add and log round it: the
// engine's vectorized log loop (engine/cpu/unary_loops.h), the same bits as
// kernel_math.h's log_rn on every CPU.
std::vector<float> log_plus_eps(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = v[i] + kLogEps;
  cpu_unary(UnaryFn{UnaryFn::Op::log}, out.data(), out.data(), static_cast<int64_t>(out.size()));
  return out;
}

void check_waveforms(const char* what, const Tensor& x) {
  VQDDP_CHECK(x.defined() && x.dim() == 2 && x.dtype() == DType::f32, "{}: waveforms must be float32 [N, L], got {}",
              what, x.defined() ? x.desc() : "an undefined tensor");
}

}  // namespace

// ---- Stft ------------------------------------------------------------------------

// host_magnitude's constants: the window in double, and the FFT for a
// power of two or else the DFT's cos and sin of 2 pi j / n_fft.
struct Stft::HostPlan {
  std::vector<double> window, cos, sin;
  std::optional<Fft> fft;
};

Stft::Stft(int64_t n_fft, int64_t hop) : n_fft_(n_fft), hop_(hop), cache_(std::make_shared<Cache>()) {
  VQDDP_CHECK(n_fft >= 2, "Stft: n_fft must be at least 2, got {}", n_fft);
  VQDDP_CHECK(hop >= 1, "Stft: hop must be at least 1, got {} (n_fft {})", hop, n_fft);
  cache_->kernels.emplace(device_key(Device::cpu()), stft_kernels(n_fft));
  auto plan = std::make_shared<HostPlan>();
  for (int64_t n = 0; n < n_fft; ++n) plan->window.push_back(hann(n, n_fft));
  if ((n_fft & (n_fft - 1)) == 0 && n_fft <= (int64_t{1} << 30)) {
    plan->fft.emplace(static_cast<int>(n_fft));
  } else {
    for (int64_t j = 0; j < n_fft; ++j) {
      plan->cos.push_back(std::cos(2 * std::numbers::pi * j / n_fft));
      plan->sin.push_back(std::sin(2 * std::numbers::pi * j / n_fft));
    }
  }
  host_ = std::move(plan);
}

std::vector<float> Stft::host_magnitude(const float* x, int64_t length) const {
  const int64_t t = frames(length), b = bins(), n = n_fft_;
  const std::vector<double>& w = host_->window;
  std::vector<float> out(static_cast<size_t>(b * t));
  auto put = [&](int64_t f, int64_t k, double power) {
    out[k * t + f] = static_cast<float>(std::sqrt(power + kMagnitudeEps));
  };
  if (host_->fft) {
    // Two frames a transform: frame f as the real part, f + 1 as the
    // imaginary (Fft::split_power).
    const Fft& fft = *host_->fft;
    std::vector<std::complex<double>> z(static_cast<size_t>(n));
    for (int64_t f = 0; f < t; f += 2) {
      const bool pair = f + 1 < t;
      const float* a = x + f * hop_;
      const float* c = pair ? a + hop_ : a;
      for (int64_t i = 0; i < n; ++i) z[i] = {w[i] * a[i], pair ? w[i] * c[i] : 0.0};
      fft(z.data());
      for (int64_t k = 0; k < b; ++k) {
        const auto [pa, pc] = fft.split_power(z.data(), static_cast<int>(k));
        put(f, k, pa);
        if (pair) put(f + 1, k, pc);
      }
    }
  } else {
    std::vector<double> v(static_cast<size_t>(n));
    for (int64_t f = 0; f < t; ++f) {
      for (int64_t i = 0; i < n; ++i) v[i] = w[i] * x[f * hop_ + i];
      for (int64_t k = 0; k < b; ++k) {
        double re = 0, im = 0;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t j = (k * i) % n;  // the angle's index, as the kernels take it
          re += v[i] * host_->cos[j];
          im -= v[i] * host_->sin[j];
        }
        put(f, k, re * re + im * im);
      }
    }
  }
  return out;
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
    Tensor term = add(global_mean_or_zero(log_magnitude_error(mx, my), comm), global_mean_or_zero(abs(sub(mx, my)), comm));
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
    Tensor term = global_mean_or_zero(abs(sub((*mel)(x), (*mel)(y))), comm);
    total = total.defined() ? add(total, term) : term;
  }
  return div(total, static_cast<float>(mels_.size()));
}

// ---- StoiLoss --------------------------------------------------------------------------

namespace {

// The power-of-two window nearest STOI's 25.6 ms frame (the lower of two
// equally near).
int64_t stoi_loss_window(double sample_rate) {
  VQDDP_CHECK(std::isfinite(sample_rate) && sample_rate > 0, "StoiLoss: sample rate must be positive, got {}",
              sample_rate);
  const double want = 0.0256 * sample_rate;
  int64_t n = 2;
  while (n < (int64_t{1} << 20) && std::abs(2.0 * n - want) < std::abs(n - want)) n *= 2;
  return n;
}

}  // namespace

StoiLoss::StoiLoss(double sample_rate)
    : stft_(stoi_loss_window(sample_rate), stoi_loss_window(sample_rate) / 4), cache_(std::make_shared<Cache>()) {
  const int64_t bins = stft_.bins();
  std::vector<float> w;
  for (int band = 0; band < kThirdOctaveBands; ++band) {
    const BinRange r = third_octave_bins(band, sample_rate, stft_.n_fft());
    // A band whose lower edge reaches the Nyquist bin has nothing above it.
    if (r.lo >= bins - 1 || r.hi <= r.lo) break;
    for (int64_t k = 0; k < bins; ++k) w.push_back(k >= r.lo && k < r.hi ? 1.f : 0.f);
    ++bands_;
  }
  VQDDP_CHECK(bands_ > 0, "StoiLoss: no one-third-octave band below {} Hz", sample_rate / 2);
  cache_->weights.emplace(device_key(Device::cpu()), from_vector(w, {bands_, bins, 1}));
}

Tensor StoiLoss::envelopes(const Tensor& x) const {
  Tensor power = square(stft_.magnitude(x));  // [N, bins, T], each at least 1e-7
  return sqrt(bands_of(power, cached_on(cache_->mu, cache_->weights, x.device())));
}

Tensor StoiLoss::operator()(const Tensor& x, const Tensor& y, Communicator& comm) const {
  check_waveforms("StoiLoss (reference x)", x);
  check_waveforms("StoiLoss (reconstruction y)", y);
  const int64_t frames = stft_.frames(x.size(1));  // a short signal fails with every N
  const float half = static_cast<float>(stft_.n_fft()) / 2;
  const float eps = static_cast<float>(frames) * (1e-3f * half) * (1e-3f * half);
  Tensor ex = envelopes(x), ey = envelopes(y);
  Tensor cx = sub(ex, mean(ex, 2, true)), cy = sub(ey, mean(ey, 2, true));
  Tensor corr = div(sum(mul(cx, cy), 2), sqrt(mul(add(sum(square(cx), 2), eps), add(sum(square(cy), 2), eps))));
  return add(neg(global_mean_or_zero(corr, comm)), 1.f);
}

// ---- LogMel ----------------------------------------------------------------------------

LogMel::LogMel(double sample_rate, int64_t n_fft, int64_t hop, int64_t n_mels)
    : stft_(n_fft, hop), n_mels_(n_mels), cache_(std::make_shared<Cache>()) {
  VQDDP_CHECK(std::isfinite(sample_rate) && sample_rate > 0, "LogMel: sample rate must be positive, got {}",
              sample_rate);
  VQDDP_CHECK(n_mels >= 1, "LogMel: n_mels must be at least 1, got {}", n_mels);
  filterbank_ = mel_filterbank(sample_rate, n_fft, n_mels);
  // The host path's filters as runs of nonzero bins (a triangle covers a
  // few of the bins), so a frame costs their width, not bins * n_mels.
  const std::vector<float> fb = filterbank_.to_vector<float>();
  auto bands = std::make_shared<std::vector<Band>>(static_cast<size_t>(n_mels));
  for (int64_t m = 0; m < n_mels; ++m) {
    Band& band = (*bands)[m];
    band.lo = stft_.bins();
    for (int64_t k = 0; k < stft_.bins(); ++k)
      if (fb[k * n_mels + m] != 0) {
        band.lo = std::min(band.lo, k);
        band.hi = k + 1;
      }
    for (int64_t k = band.lo; k < band.hi; ++k) band.weights.push_back(fb[k * n_mels + m]);
  }
  bands_ = std::move(bands);
  // [bins, n_mels] -> [n_mels, bins, 1]: transpose copies, then a view.
  cache_->weights.emplace(device_key(Device::cpu()), reshape(transpose(filterbank_), {n_mels, stft_.bins(), 1}));
}

Tensor LogMel::operator()(const Tensor& x) const {
  Tensor mag = stft_.magnitude(x);  // [N, bins, T]
  return log(add(bands_of(mag, cached_on(cache_->mu, cache_->weights, x.device())), kLogEps));
}

std::vector<float> LogMel::host(const float* x, int64_t length) const {
  const std::vector<float> mag = stft_.host_magnitude(x, length);  // [bins, T]
  const int64_t t = stft_.frames(length);
  std::vector<float> out(static_cast<size_t>(n_mels_ * t));
  std::vector<double> v(static_cast<size_t>(t));
  for (int64_t m = 0; m < n_mels_; ++m) {
    const Band& band = (*bands_)[m];
    std::fill(v.begin(), v.end(), 0.0);
    for (int64_t k = band.lo; k < band.hi; ++k) {  // bin by bin, each over every frame (contiguous rows)
      const double weight = band.weights[k - band.lo];
      const float* row = mag.data() + k * t;
      for (int64_t f = 0; f < t; ++f) v[f] += weight * row[f];
    }
    for (int64_t f = 0; f < t; ++f) out[m * t + f] = static_cast<float>(v[f]);
  }
  return log_plus_eps(out);
}

namespace {

// x and y as measurements take them: [N, L] of one shape and device, at
// least one frame long; read to the host.
void check_pair(const char* what, const Stft& stft, const Tensor& x, const Tensor& y) {
  check_waveforms(what, x);
  check_waveforms(what, y);
  VQDDP_CHECK(x.shape() == y.shape() && x.device() == y.device(), "{}: x {} and y {} must have one shape and device",
              what, x.desc(), y.desc());
  stft.frames(x.size(1));  // a short signal fails with every N
}

// sum over rows of `row_sum(x row, y row)`, in row order.
template <class RowSum>
SumCount over_rows(const Tensor& x, const Tensor& y, RowSum row_sum) {
  SumCount total;
  if (x.size(0) == 0) return total;
  const std::vector<float> hx = x.to_vector<float>(), hy = y.to_vector<float>();
  const int64_t length = x.size(1);
  for (int64_t r = 0; r < x.size(0); ++r) {
    const SumCount part = row_sum(hx.data() + r * length, hy.data() + r * length, length);
    total.sum += part.sum;
    total.count += part.count;
  }
  return total;
}

}  // namespace

SumCount log_mel_l1(const LogMel& mel, const Tensor& x, const Tensor& y) {
  check_pair("log_mel_l1", mel.stft(), x, y);
  return over_rows(x, y, [&](const float* a, const float* b, int64_t length) {
    return log_mel_l1_against(mel, mel.host(a, length), b, length);
  });
}

SumCount log_mel_l1_against(const LogMel& mel, const std::vector<float>& mel_x, const float* y, int64_t length) {
  const std::vector<float> mel_y = mel.host(y, length);
  VQDDP_CHECK(mel_x.size() == mel_y.size(), "log_mel_l1: the reference's log-mel has {} values and the output's {}",
              mel_x.size(), mel_y.size());
  double sum = 0;
  for (size_t i = 0; i < mel_y.size(); ++i) sum += std::fabs(mel_x[i] - mel_y[i]);
  return {sum, static_cast<double>(mel_y.size())};
}

SumCount stft_distance(const Stft& stft, const Tensor& x, const Tensor& y) {
  check_pair("stft_distance", stft, x, y);
  return over_rows(x, y, [&](const float* a, const float* b, int64_t length) {
    return stft_distance_against(stft, stft_reference(stft, a, length), b, length);
  });
}

StftReference stft_reference(const Stft& stft, const float* x, int64_t length) {
  StftReference r;
  r.magnitude = stft.host_magnitude(x, length);
  r.log_magnitude = log_plus_eps(r.magnitude);
  return r;
}

SumCount stft_distance_against(const Stft& stft, const StftReference& x, const float* y, int64_t length) {
  const StftReference out = stft_reference(stft, y, length);
  VQDDP_CHECK(x.magnitude.size() == out.magnitude.size(),
              "stft_distance: the reference's magnitudes have {} values and the output's {}", x.magnitude.size(),
              out.magnitude.size());
  double sum = 0;
  for (size_t i = 0; i < out.magnitude.size(); ++i)
    sum += std::fabs(x.log_magnitude[i] - out.log_magnitude[i]) + std::fabs(x.magnitude[i] - out.magnitude[i]);
  return {sum, static_cast<double>(out.magnitude.size())};
}

LogMel held_out_log_mel(double sample_rate) { return LogMel(sample_rate, 256, 64, 40); }

}  // namespace vqddp
