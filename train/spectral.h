// Spectral losses and metrics for waveform codecs: STFT magnitudes, the
// multi-resolution STFT loss (Parallel WaveGAN, DAC) and a log-mel distance
// for evaluation.
//
// The STFT is a strided conv1d with fixed Hann-windowed cosine and sine
// kernels instead of an FFT: it uses only engine ops, so it is differentiable
// and runs on every device (and is batch-invariant like conv1d) with no new
// dependency. The cost, O(n_fft^2) per frame instead of O(n_fft log n_fft),
// is small at the sizes a codec loss uses (n_fft <= 2048). The held-out
// measurements (log_mel_l1, stft_distance), which need no gradient, run the
// same formulas on the host with an FFT instead.
//
// The fixed kernels are plain tensors, never module parameters or buffers:
// they must not reach an optimizer or a checkpoint (they are rebuilt
// bit-identically from n_fft whenever they are needed).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "engine/core/tensor.h"

namespace vqddp {

// STFT magnitudes with no padding (the frames cover the signal exactly as
// far as they fit) and a periodic Hann window, as torch.stft(center=False).
class Stft {
 public:
  // n_fft >= 2 samples per frame, hop >= 1 samples between frames.
  Stft(int64_t n_fft, int64_t hop);

  // x [N, L] waveforms, L >= n_fft -> |X| [N, n_fft / 2 + 1, frames] with
  // frames = (L - n_fft) / hop + 1. magnitude = sqrt(re^2 + im^2 + 1e-7):
  // the epsilon keeps the gradient finite on silent frames (sqrt'(0) is
  // infinite). Differentiable w.r.t. x; x may be on any device.
  Tensor magnitude(const Tensor& x) const;
  // The complex STFT as two channels: x [N, L] -> [N, 2, bins, frames],
  // channel 0 the real parts, channel 1 the imaginary (the input of the
  // multi-scale STFT discriminator, train/discriminators.h).
  Tensor complex(const Tensor& x) const;

  int64_t n_fft() const { return n_fft_; }
  int64_t hop() const { return hop_; }
  int64_t bins() const { return n_fft_ / 2 + 1; }
  // The number of frames for a signal of `length` samples; throws naming
  // n_fft and the length when the signal is shorter than one frame.
  int64_t frames(int64_t length) const;

  // The measurements' magnitudes (log_mel_l1, stft_distance below): one
  // host waveform of `length` >= n_fft samples -> [bins, frames], row
  // major. magnitude()'s formula computed in double, by an FFT (train/fft.h)
  // when n_fft is a power of two and a direct DFT otherwise, each value
  // rounded to float once: within float rounding of magnitude(), not bit for
  // bit. No tensors, so no autograd and no allocation per op: a measurement
  // needs neither, and the conv's O(n_fft^2) products per frame and the
  // ops' temporaries were most of `vqddp eval`'s scoring time.
  std::vector<float> host_magnitude(const float* x, int64_t length) const;

 private:
  // The kernels on `device` (copied there on first use, then cached).
  Tensor kernels_on(Device device) const;

  int64_t n_fft_, hop_;
  struct HostPlan;  // the window and the FFT (or DFT table) of host_magnitude
  std::shared_ptr<const HostPlan> host_;
  // Kernels per device, keyed by (kind, index); the CPU's entry is the host
  // original [2 * bins, 1, n_fft]: cosine rows, then sine rows, window
  // folded in. Shared by copies of this Stft (the values never change), so
  // the loss below can hold Stfts by value; the mutex guards first use from
  // several rank threads.
  struct Cache {
    std::mutex mu;
    std::map<std::pair<int, int>, Tensor> kernels;
  };
  std::shared_ptr<Cache> cache_;
};

// The (n_fft, hop) resolutions of the codec's STFT loss (model.spectral_weight)
// and of the held-out MR-STFT distance: 8 to 32 ms windows at 8 kHz, hop a
// quarter window (DAC's choice of several resolutions, scaled to short
// segments).
inline constexpr std::array<std::pair<int64_t, int64_t>, 3> kStftLossResolutions{{{64, 16}, {128, 32}, {256, 64}}};

// The multi-resolution STFT loss, for each (n_fft, hop) resolution
//   mean |log(|X| + 1e-5) - log(|Y| + 1e-5)| + mean | |X| - |Y| |,
// summed over resolutions and divided by their number.
class MultiResolutionStftLoss {
 public:
  // At least one resolution; each (n_fft, hop) as Stft requires.
  explicit MultiResolutionStftLoss(std::vector<std::pair<int64_t, int64_t>> resolutions);

  // x the reference, y the reconstruction, both [N, L] on one device, with
  // L >= every n_fft (else an error naming the n_fft and L). A scalar: the
  // means over the global batch in an exact step (vq/losses.h), over this
  // rank's rows otherwise; for N == 0 the rank's terms are zeros that stay
  // in x's and y's graphs, so it runs the same collectives and backward as
  // the others.
  Tensor operator()(const Tensor& x, const Tensor& y, Communicator& comm) const;

  const std::vector<Stft>& stfts() const { return stfts_; }

 private:
  std::vector<Stft> stfts_;
};

class LogMel;

// The multi-resolution log-mel loss (DAC's mel loss): for each LogMel,
//   mean |logmel(x) - logmel(y)|,
// summed over resolutions and divided by their number. Global-batch means in
// an exact step, as MultiResolutionStftLoss.
class MultiResolutionMelLoss {
 public:
  // mels: (n_fft, hop, n_mels) per resolution, at least one.
  MultiResolutionMelLoss(double sample_rate, const std::vector<std::array<int64_t, 3>>& mels);
  Tensor operator()(const Tensor& x, const Tensor& y, Communicator& comm) const;

 private:
  std::vector<std::shared_ptr<const LogMel>> mels_;
};

// A differentiable stand-in for STOI (train/stoi.h) as a training loss
// (model.stoi_weight). STOI scores how well the envelope of each
// one-third-octave band over time survives coding, by correlation: every
// band counts alike, however little energy it has, which a waveform loss
// (dominated by the loud low bands) and a log-mel loss (dominated by quiet
// frames in the log) both miss. Here, at the training rate: an STFT with
// the power-of-two window nearest STOI's 25.6 ms (256 samples at 8 kHz),
// hop a quarter window; STOI's bands (third_octave_bins) up to the Nyquist
// frequency; a band's envelope sqrt(sum of |X|^2 over its bins); and
//   loss = mean over examples and bands of 1 - corr(env_x, env_y),
// the correlation over the example's frames (means removed), each variance
// plus eps = frames * (1e-3 * n_fft / 2)^2, the variance of an envelope
// that moves by about a -60 dBFS sine's, so a silent band gives no gradient
// instead of amplifying noise. STOI's 384 ms segments, silent-frame removal
// and clipping are left out: a training example is one segment (0.2 s for
// the speech codecs), and the loss needs a gradient everywhere. Global-
// batch means in an exact step, as MultiResolutionStftLoss.
class StoiLoss {
 public:
  explicit StoiLoss(double sample_rate);
  // x the reference, y the reconstruction, [N, L] on one device, L >= n_fft.
  Tensor operator()(const Tensor& x, const Tensor& y, Communicator& comm) const;

  const Stft& stft() const { return stft_; }
  int64_t bands() const { return bands_; }

 private:
  Tensor envelopes(const Tensor& x) const;  // [N, L] -> [N, bands, frames]

  Stft stft_;
  int64_t bands_ = 0;
  struct Cache {  // the bands as a conv1d weight [bands, bins, 1] of 0 and 1, per device
    std::mutex mu;
    std::map<std::pair<int, int>, Tensor> weights;
  };
  std::shared_ptr<Cache> cache_;
};

// Log-mel spectrogram, log(mel(|X|) + 1e-5), with triangular filters on the
// HTK mel scale (2595 log10(1 + f / 700)) spaced evenly between 0 and
// sample_rate / 2, unnormalised (each peaks at 1), applied to magnitudes
// (power 1). For evaluation; differentiable all the same.
class LogMel {
 public:
  // Throws if a filter would cover no STFT bin (n_mels too many for n_fft):
  // that band would be a constant, not a measurement.
  LogMel(double sample_rate, int64_t n_fft, int64_t hop, int64_t n_mels);

  // x [N, L] -> [N, n_mels, frames].
  Tensor operator()(const Tensor& x) const;

  int64_t n_mels() const { return n_mels_; }
  const Stft& stft() const { return stft_; }
  // The host filterbank [n_fft / 2 + 1, n_mels]: column m is filter m.
  const Tensor& filterbank() const { return filterbank_; }
  // operator()'s formula for the measurements: one host waveform ->
  // [n_mels, frames], from Stft::host_magnitude with the filters' sums in
  // double (within float rounding of operator(), not bit for bit).
  std::vector<float> host(const float* x, int64_t length) const;

 private:
  Stft stft_;
  int64_t n_mels_;
  Tensor filterbank_;  // [bins, n_mels], host
  struct Band {         // filter m's nonzero bins, [lo, hi), and their weights
    int64_t lo = 0, hi = 0;
    std::vector<double> weights;
  };
  std::shared_ptr<const std::vector<Band>> bands_;
  // The same filters as a kernel-size-1 conv1d weight [n_mels, bins, 1], so
  // [N, bins, T] maps to [N, n_mels, T] without transposes; one copy per
  // device as for the Stft kernels.
  struct Cache {
    std::mutex mu;
    std::map<std::pair<int, int>, Tensor> weights;
  };
  std::shared_ptr<Cache> cache_;
};

// The log-mel of the held-out log-mel L1 distance (validation and `vqddp
// eval`; docs/models.md): 256-sample windows, hop 64, 40 mels, which are
// 32 ms windows and an 8 ms hop at 8 kHz.
LogMel held_out_log_mel(double sample_rate);

// The log-mel L1 distance in parts that add across batches and ranks: the
// sum over elements of |logmel(x) - logmel(y)| and the element count
// (N * n_mels * frames), as host doubles; the distance is sum / count.
// x and y [N, L] on any one device; {0, 0} for N == 0. A measurement, not a
// loss: it reads x and y to the host and works there (LogMel::host), with
// no autograd, and sums in double in row, mel, frame order, so a clip's sum
// does not depend on the batch it came in.
struct SumCount {
  double sum = 0;
  double count = 0;
};
SumCount log_mel_l1(const LogMel& mel, const Tensor& x, const Tensor& y);

// One resolution's term of the multi-resolution STFT loss in parts that
// add across batches and ranks: the sum over elements of
// |log(|X| + 1e-5) - log(|Y| + 1e-5)| + ||X| - |Y|| and the element count;
// the held-out distance (train/validation.cpp) averages sum / count over the
// resolutions. As log_mel_l1: on the host (Stft::host_magnitude), {0, 0}
// for N == 0.
SumCount stft_distance(const Stft& stft, const Tensor& x, const Tensor& y);

// The same two distances for one host waveform y of `length` samples with
// the reference's half given: for scoring many outputs against one
// reference (`vqddp eval`), whose features are then computed once. The
// same sums as above for a one-row x, bit for bit. x must have y's length:
// the features are checked by count only, which a length within one hop
// of it would pass.
SumCount log_mel_l1_against(const LogMel& mel, const std::vector<float>& mel_x, const float* y, int64_t length);
// The reference's half of stft_distance: |X| and log(|X| + 1e-5).
struct StftReference {
  std::vector<float> magnitude, log_magnitude;
};
StftReference stft_reference(const Stft& stft, const float* x, int64_t length);
SumCount stft_distance_against(const Stft& stft, const StftReference& x, const float* y, int64_t length);

}  // namespace vqddp
