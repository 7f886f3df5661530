// STOI, the short-time objective intelligibility measure (Taal, Hendriks,
// Heusdens, Jensen 2011, "An Algorithm for Intelligibility Prediction of
// Time-Frequency Weighted Noisy Speech"), and its extended form ESTOI (Jensen
// and Taal 2016): how intelligible a degraded signal (a decoded clip, noisy
// or enhanced speech) is, judged against the clean one. Values near 1 are
// intelligible; it is a metric for evaluation, not a loss (no gradient).
//
// The algorithm, with the parameters of the widely used reference (the
// authors' MATLAB code and its Python port, pystoi):
// 1. Both signals are resampled to 10 kHz.
// 2. Silent-frame removal: frames of 256 samples, hop 128, windowed by a Hann
//    window of 256 points without its zero ends (the reference's
//    hanning(258)[1:-1], MATLAB's hanning(256)), whose clean energy
//    20 log10 |w x| is 40 dB or more below the loudest clean frame's are
//    dropped from both signals; the frames kept (still windowed) are
//    overlap-added back into two signals. The clean signal alone decides,
//    so STOI does not depend on the degraded signal's scale. The frames are
//    the reference's: they start at 0, 128, ... while the start is below
//    length - 256, so a frame that would end exactly on the last sample is
//    not taken (here and in step 3).
// 3. STFT of those signals: the same frames and window (so each sample is
//    windowed twice, as in the reference), each frame's 256 samples
//    zero-padded to a 512-point DFT.
// 4. 15 one-third-octave bands, centres 150 * 2^(k/3) Hz (150 Hz to about
//    3.8 kHz), edges centre * 2^(-1/6) and centre * 2^(1/6) each rounded to
//    the nearest DFT bin (10000/512 Hz apart); a band holds the bins from its
//    lower edge's up to, not including, its upper edge's. A band's envelope
//    is the square root of the sum of its bins' power, per frame.
// 5. Segments of N = 30 frames (384 ms), one ending at every frame from the
//    30th on (they overlap by 29 frames, as in the paper).
//    STOI: within a segment and band, the degraded envelope y is scaled to the
//    clean envelope x's norm, y' = y |x| / |y|, and clipped to at most
//    (1 + 10^(-beta/20)) x with beta = -15 dB (a signal-to-distortion floor
//    of -15 dB); the score of that band and segment is the correlation
//    coefficient of x and y'. STOI is the mean over bands and segments.
//    ESTOI: within a segment, the 15 x 30 envelope matrices of each signal
//    (no scaling, no clipping) have their rows (bands across time) then
//    their columns (frames across bands) brought to zero mean and unit
//    norm; the segment's score is the mean over its 30 frames of the inner
//    product of the clean and degraded columns. ESTOI is the mean over
//    segments.
// Everything after resampling is computed in double.
//
// Deviations from the reference, each deliberate:
// - Resampling is libsoxr's high quality (vqddp::resample, data/audio.h), not
//   the reference's polyphase resampler (MATLAB's resample, pystoi's
//   resample_poly with its own filter). A clip not at 10 kHz therefore
//   scores slightly differently; at 10 kHz nothing is resampled and the
//   rest of the algorithm is the reference's.
// - The reference adds 2.2e-16 (double epsilon) to the norms it divides by,
//   so a silent segment of the degraded signal scores 0 instead of NaN;
//   STOI does the same. ESTOI's reference instead adds random noise of that
//   size to the matrices before each normalisation (making the result vary
//   in its last digits from call to call); here the epsilon is added to the
//   norms, as for STOI, so the result is deterministic. The two differ at
//   the scale of that epsilon relative to the envelopes, unless a band or
//   frame of a segment is exactly constant (then the reference's is random).
// - A clip that keeps fewer than 30 frames after silent-frame removal (a
//   clip shorter than about 0.41 s, stoi_min_samples, or a longer one that
//   is nearly all silence) has no segment: the reference warns and returns
//   1e-5; here it is an error naming the clip's length and the frames it
//   kept (stoi_if_scorable: no score). A silent clean signal (every frame
//   all zeros), which the reference scores 0, is the same.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace vqddp {

// One-third-octave band `band` (0-based) as STOI defines it: centre
// 150 * 2^(band / 3) Hz, edges a sixth of an octave either side, each
// rounded to the nearest bin of an n_fft-point DFT at `rate` Hz (the first
// of two equally near, bins 0 to n_fft / 2): the bins [lo, hi). STOI's own
// bands (10 kHz, 512 points) and the training loss's (train/spectral.h
// StoiLoss, at the training rate) come from this one formula.
inline constexpr int kThirdOctaveBands = 15;  // STOI's: centres 150 Hz to 3.8 kHz
struct BinRange {
  int64_t lo = 0, hi = 0;
};
BinRange third_octave_bins(int band, double rate, int64_t n_fft);


// STOI (ESTOI when `extended`) of `degraded` against `clean`, both at `rate`
// Hz and of the same length. Refused with an Error: a non-positive rate,
// signals of different lengths (both are named), a non-finite sample, a
// silent clean signal, and a clip that keeps fewer than 30 frames (one
// 384 ms segment) after silent-frame removal.
double stoi(const std::vector<float>& clean, const std::vector<float>& degraded, int rate, bool extended = false);

// The same, or nullopt for a clip that has no score: too short or too
// quiet for one segment, or a silent clean signal (where stoi throws). For
// scoring many chunks, some of them silence (validation). Bad arguments (a
// non-positive rate, different lengths, a non-finite sample) still throw.
std::optional<double> stoi_if_scorable(const std::vector<float>& clean, const std::vector<float>& degraded, int rate,
                                       bool extended = false);

// The clean signal's half of the measure, computed once to score many
// degraded versions of one clip (`vqddp eval`'s systems): its resampling,
// its silent frames (which decide the degraded signals' too) and its band
// envelopes. score() gives stoi()'s two values, bit for bit.
class StoiReference {
 public:
  // Throws for a non-positive rate or a non-finite sample; a clip without a
  // score is not an error here (scorable() false, why() says why).
  StoiReference(const std::vector<float>& clean, int rate);

  bool scorable() const { return why_.empty(); }
  const std::string& why() const { return why_; }

  struct Scores {
    double stoi = 0, estoi = 0;
  };
  // Refused as stoi() refuses: another length, a non-finite sample, a clip
  // without a score (why()).
  Scores score(const std::vector<float>& degraded) const;

 private:
  int rate_;
  size_t length_;
  std::string why_;
  std::vector<int64_t> keep_;                      // the frames kept at 10 kHz
  int64_t frames_ = 0;                             // STFT frames of what they overlap-add to
  std::vector<std::vector<double>> envelopes_;     // [band][frame]
};

// The fewest samples at `rate` Hz a clip needs to give one STOI segment when
// none of its frames is silent: 30 frames after silent-frame removal (the
// paper's one segment of 384 ms) need 4097 samples at 10 kHz (31 frames of
// 256 with hop 128 overlap-add to 4096 samples, which give 30 STFT frames
// by the reference's framing, step 2 above). A clip with silent frames
// needs more. Throws for a non-positive rate.
int64_t stoi_min_samples(int rate);

}  // namespace vqddp
