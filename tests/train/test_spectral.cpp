// Spectral losses (train/spectral.h): the conv1d STFT against a direct DFT,
// gradients by finite differences, the loss's zero and empty cases, the mel
// filterbank's shape and the clear errors for signals shorter than a frame.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <numbers>

#include "comm/single.h"
#include "engine/autograd.h"
#include "engine/core/error.h"
#include "engine/ops.h"
#include "engine/core/random.h"
#include "tests/engine/gradcheck.h"
#include "train/fft.h"
#include "train/spectral.h"
#include "train/stoi.h"

using namespace vqddp;
using namespace vqddp::test;

namespace {

SingleCommunicator one;  // the losses of these tests span one rank

const double kTwoPi = 2 * std::numbers::pi;

// |DFT| of each frame with a periodic Hann window, in double, O(n^2), with
// the same epsilon under the sqrt as Stft::magnitude. [bins, frames] of one row.
std::vector<std::vector<double>> direct_stft(const std::vector<double>& x, int64_t n_fft, int64_t hop) {
  int64_t frames = (static_cast<int64_t>(x.size()) - n_fft) / hop + 1, bins = n_fft / 2 + 1;
  std::vector<std::vector<double>> out(bins, std::vector<double>(frames));
  for (int64_t t = 0; t < frames; ++t)
    for (int64_t k = 0; k < bins; ++k) {
      double re = 0, im = 0;
      for (int64_t n = 0; n < n_fft; ++n) {
        double v = x[t * hop + n] * (0.5 - 0.5 * std::cos(kTwoPi * n / n_fft));
        re += v * std::cos(kTwoPi * k * n / n_fft);
        im -= v * std::sin(kTwoPi * k * n / n_fft);
      }
      out[k][t] = std::sqrt(re * re + im * im + 1e-7);
    }
  return out;
}

// Smallest element of a host tensor.
float min_of(const Tensor& t) {
  std::vector<float> v = t.to_vector<float>();
  return *std::min_element(v.begin(), v.end());
}

}  // namespace

TEST_CASE("spectral: Stft magnitude of a bin-centred cosine peaks at its bin and matches a direct DFT") {
  const int64_t n_fft = 64, hop = 16, len = 256, bins = n_fft / 2 + 1;
  const int64_t peak[2] = {5, 12};
  const double amp[2] = {1.0, 0.5}, phase[2] = {0.0, 0.7};
  std::vector<double> rows[2];
  std::vector<float> host;
  for (int r = 0; r < 2; ++r)
    for (int64_t n = 0; n < len; ++n) {
      rows[r].push_back(static_cast<double>(static_cast<float>(amp[r] * std::cos(kTwoPi * peak[r] * n / n_fft + phase[r]))));
      host.push_back(static_cast<float>(rows[r].back()));
    }
  Stft stft(n_fft, hop);
  CHECK(stft.n_fft() == n_fft);
  CHECK(stft.hop() == hop);
  Tensor mag = stft.magnitude(from_vector(host, {2, len}));
  const int64_t frames = (len - n_fft) / hop + 1;
  REQUIRE(mag.shape() == Shape{2, bins, frames});
  const float* m = mag.data<float>();
  for (int r = 0; r < 2; ++r) {
    auto ref = direct_stft(rows[r], n_fft, hop);
    for (int64_t t = 0; t < frames; ++t) {
      int64_t best = 0;
      for (int64_t k = 0; k < bins; ++k) {
        double got = m[(r * bins + k) * frames + t];
        CHECK_MESSAGE(std::abs(got - ref[k][t]) <= 1e-4 * ref[k][t], "row ", r, " bin ", k, " frame ", t, ": ", got,
                      " vs ", ref[k][t]);
        if (got > m[(r * bins + best) * frames + t]) best = k;
      }
      CHECK(best == peak[r]);
      // A Hann window turns a bin-centred cosine into amp * n_fft / 4 at its bin.
      CHECK(m[(r * bins + peak[r]) * frames + t] == doctest::Approx(amp[r] * n_fft / 4).epsilon(1e-5));
    }
  }
}

TEST_CASE("spectral: Stft::complex gives the real and imaginary parts of a direct DFT, and magnitude is their norm") {
  const int64_t n_fft = 32, hop = 8, len = 96, bins = n_fft / 2 + 1, frames = (len - n_fft) / hop + 1;
  Generator gen(4, 2);
  Tensor x = rand_uniform({2, len}, gen, -1.f, 1.f);
  Stft stft(n_fft, hop);
  Tensor z = stft.complex(x);
  REQUIRE(z.shape() == Shape{2, 2, bins, frames});
  const std::vector<float> xs = x.to_vector<float>(), zs = z.to_vector<float>(), mag = stft.magnitude(x).to_vector<float>();
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t t = 0; t < frames; ++t)
      for (int64_t k = 0; k < bins; ++k) {
        double re = 0, im = 0;
        for (int64_t n = 0; n < n_fft; ++n) {
          double v = xs[r * len + t * hop + n] * (0.5 - 0.5 * std::cos(kTwoPi * n / n_fft));
          re += v * std::cos(kTwoPi * k * n / n_fft);
          im -= v * std::sin(kTwoPi * k * n / n_fft);
        }
        const float zr = zs[((r * 2 + 0) * bins + k) * frames + t], zi = zs[((r * 2 + 1) * bins + k) * frames + t];
        CHECK(zr == doctest::Approx(re).epsilon(1e-4).scale(1.0));
        CHECK(zi == doctest::Approx(im).epsilon(1e-4).scale(1.0));
        CHECK(mag[(r * bins + k) * frames + t] == std::sqrt(zr * zr + zi * zi + 1e-7f));
      }
}

TEST_CASE("spectral: the multi-resolution mel loss is 0 for a perfect reconstruction, grows with the error, and a "
          "rank without rows keeps both signals' graphs") {
  Generator gen(6, 3);
  Tensor x = rand_uniform({3, 600}, gen, -1.f, 1.f);
  MultiResolutionMelLoss loss(8000, {{64, 16, 10}, {256, 64, 40}});
  CHECK(loss(x, x, one).item<float>() == 0.f);
  const float small = loss(x, mul(x, 0.9f), one).item<float>(), large = loss(x, mul(x, 0.5f), one).item<float>();
  CHECK(small > 0.f);
  CHECK(large > small);
  Tensor e = zeros({0, 600}).set_requires_grad(true), y = zeros({0, 600}).set_requires_grad(true);
  Tensor l = loss(e, y, one);
  l.backward();
  CHECK(l.item<float>() == 0.f);
  CHECK(y.grad().defined());
  CHECK(e.grad().defined());
}

TEST_CASE("spectral: the same magnitudes from a copy on the simulated device") {
  Generator gen(3, 1);
  Tensor x = rand_uniform({3, 100}, gen, -1.f, 1.f);
  Stft stft(32, 8);
  Tensor cpu = stft.magnitude(x);
  for (int pass = 0; pass < 2; ++pass) {  // the second pass uses the cached device kernels
    Tensor sim = stft.magnitude(x.to(Device::sim())).to(Device::cpu());
    CHECK(sim.to_vector<float>() == cpu.to_vector<float>());
  }
  LogMel mel(8000, 32, 8, 4);
  CHECK(mel(x.to(Device::sim())).to(Device::cpu()).to_vector<float>() == mel(x).to_vector<float>());
}

TEST_CASE("spectral: gradcheck of the magnitude and of the multi-resolution loss") {
  const int64_t n_fft = 8, hop = 4, len = 16;
  Stft stft(n_fft, hop);
  // Finite differences of sqrt are only accurate away from 0: a seed and
  // amplitude whose every magnitude is far from it.
  Tensor x = param({2, len}, 277, -2.f, 2.f);
  {
    NoGradGuard g;
    REQUIRE(min_of(stft.magnitude(x)) > 0.5f);
  }
  check_gradient("stft magnitude", [&](const std::vector<Tensor>& in) { return stft.magnitude(in[0]); }, {x});

  MultiResolutionStftLoss loss({{8, 4}, {4, 2}});
  Tensor ref = param({2, len}, 1235, -4.f, 4.f).detach();
  Tensor y = param({2, len}, 235, -4.f, 4.f);
  {
    // |.| has a kink at 0: every |X| - |Y| (and so its log) stays further
    // from it than a step of 1e-2 in one sample can move it (a window
    // weight is at most 1), and |Y| away from sqrt's steep region.
    NoGradGuard g;
    for (const Stft& s : loss.stfts()) {
      REQUIRE(min_of(s.magnitude(y)) > 0.3f);
      REQUIRE(min_of(abs(sub(s.magnitude(ref), s.magnitude(y)))) > 0.03f);
    }
  }
  check_gradient("multi-resolution stft loss", [&](const std::vector<Tensor>& in) { return loss(ref, in[0], one); }, {y});
}

TEST_CASE("spectral: the loss is 0 for y == x, positive otherwise, and 0 with a working backward for N == 0") {
  MultiResolutionStftLoss loss({{16, 4}, {32, 8}, {8, 2}});
  Generator gen(5, 2);
  Tensor x = rand_uniform({3, 64}, gen, -1.f, 1.f);
  Tensor y = x.clone().set_requires_grad(true);
  Tensor same = loss(x, y, one);
  CHECK(same.shape() == Shape{});
  CHECK(same.item() == 0.f);
  Tensor other = rand_uniform({3, 64}, gen, -1.f, 1.f).set_requires_grad(true);
  Tensor diff = loss(x, other, one);
  CHECK(diff.item() > 0.f);
  diff.backward();
  CHECK(other.grad().defined());

  Tensor empty_x = zeros({0, 64});
  Tensor empty_y = zeros({0, 64}).set_requires_grad(true);
  Tensor none = loss(empty_x, empty_y, one);
  CHECK(none.shape() == Shape{});
  CHECK(none.item() == 0.f);
  CHECK(none.requires_grad());
  none.backward();
  REQUIRE(empty_y.grad().defined());
  CHECK(empty_y.grad().shape() == Shape{0, 64});
  // The magnitudes of no rows have the right shape too.
  CHECK(Stft(16, 4).magnitude(empty_x).shape() == Shape{0, 9, 13});
}

TEST_CASE("spectral: mel filters are non-negative triangles in increasing order; log_mel_l1 of x with itself is 0") {
  const int64_t n_fft = 512, hop = 128, n_mels = 40, bins = n_fft / 2 + 1;
  LogMel mel(16000, n_fft, hop, n_mels);
  const Tensor& fb = mel.filterbank();
  REQUIRE(fb.shape() == Shape{bins, n_mels});
  const float* f = fb.data<float>();
  int64_t last_peak = -1;
  for (int64_t m = 0; m < n_mels; ++m) {
    int64_t peak = 0;
    for (int64_t b = 0; b < bins; ++b) {
      CHECK(f[b * n_mels + m] >= 0.f);
      CHECK(f[b * n_mels + m] <= 1.f);
      if (f[b * n_mels + m] > f[peak * n_mels + m]) peak = b;
    }
    CHECK(f[peak * n_mels + m] > 0.f);
    CHECK_MESSAGE(peak > last_peak, "filter ", m, " peaks at bin ", peak, " after bin ", last_peak);
    last_peak = peak;
  }

  Generator gen(9, 3);
  const int64_t n = 4, len = 1600, frames = (len - n_fft) / hop + 1;
  Tensor x = rand_uniform({n, len}, gen, -1.f, 1.f);
  Tensor y = rand_uniform({n, len}, gen, -1.f, 1.f);
  CHECK(mel(x).shape() == Shape{n, n_mels, frames});
  SumCount self = log_mel_l1(mel, x, x);
  CHECK(self.sum == 0.0);
  CHECK(self.count == static_cast<double>(n * n_mels * frames));
  SumCount other = log_mel_l1(mel, x, y);
  CHECK(other.sum > 0.0);
  CHECK(other.count == self.count);
  SumCount none = log_mel_l1(mel, zeros({0, len}), zeros({0, len}));
  CHECK(none.sum == 0.0);
  CHECK(none.count == 0.0);
}

TEST_CASE("spectral: a signal shorter than n_fft, or too many mels, is refused with a clear error") {
  Tensor x = zeros({2, 32});
  CHECK_THROWS_WITH_AS(Stft(64, 16).magnitude(x), doctest::Contains("n_fft = 64"), Error);
  MultiResolutionStftLoss loss({{8, 4}, {64, 16}});
  CHECK_THROWS_WITH_AS(loss(x, x, one), doctest::Contains("n_fft = 64"), Error);
  CHECK_THROWS_WITH_AS(loss(zeros({0, 32}), zeros({0, 32}), one), doctest::Contains("L = 32"), Error);
  CHECK_THROWS_WITH_AS(log_mel_l1(LogMel(16000, 64, 16, 8), x, x), doctest::Contains("n_fft"), Error);
  CHECK_THROWS_WITH_AS(LogMel(16000, 64, 16, 80), doctest::Contains("n_mels 80 is too many for n_fft 64"), Error);
  CHECK_THROWS_WITH_AS(Stft(1, 1), doctest::Contains("n_fft"), Error);
  CHECK_THROWS_WITH_AS(MultiResolutionStftLoss({}), doctest::Contains("resolution"), Error);
}

TEST_CASE("spectral: Fft is the DFT for every power of two it takes, and refuses other sizes by name") {
  Generator gen(21, 0);
  for (int n = 2; n <= 1024; n *= 2) {
    const std::vector<float> re = rand_uniform({n}, gen, -1.f, 1.f).to_vector<float>(),
                             im = rand_uniform({n}, gen, -1.f, 1.f).to_vector<float>();
    std::vector<std::complex<double>> z(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) z[i] = {re[i], im[i]};
    const std::vector<std::complex<double>> x = z;
    const Fft fft(n);
    fft(z.data());
    double worst = 0;
    for (int k = 0; k < n; ++k) {
      std::complex<double> want = 0;
      for (int i = 0; i < n; ++i) want += x[i] * std::polar(1.0, -kTwoPi * static_cast<double>((k * i) % n) / n);
      worst = std::max(worst, std::abs(z[k] - want));
    }
    CHECK_MESSAGE(worst < 1e-12 * n, "n = ", n, ": worst error ", worst);
  }
  CHECK_THROWS_WITH_AS(Fft(12), doctest::Contains("12 points"), Error);
  CHECK_THROWS_WITH_AS(Fft(1), doctest::Contains("1 points"), Error);
}

TEST_CASE("spectral: the measurements' host magnitudes, log-mel and distances agree with the differentiable ops") {
  // n_fft 64: the FFT with an odd frame count (the last frame of a pair
  // alone); 48: the direct DFT. Within float rounding, not bit for bit.
  Generator gen(22, 0);
  for (auto [n_fft, hop, len] : {std::array<int64_t, 3>{64, 16, 64 + 16 * 10}, {64, 16, 64 + 16 * 11}, {48, 12, 300}}) {
    CAPTURE(n_fft);
    CAPTURE(len);
    Stft stft(n_fft, hop);
    const Tensor x = rand_uniform({2, len}, gen, -1.f, 1.f);
    const Tensor y = add(x, rand_uniform({2, len}, gen, -0.1f, 0.1f));
    const std::vector<float> hx = x.to_vector<float>(), hy = y.to_vector<float>();
    const std::vector<float> want = stft.magnitude(x).to_vector<float>();
    const int64_t per_row = stft.bins() * stft.frames(len);
    for (int64_t r = 0; r < 2; ++r) {
      const std::vector<float> got = stft.host_magnitude(hx.data() + r * len, len);
      REQUIRE(static_cast<int64_t>(got.size()) == per_row);
      for (int64_t i = 0; i < per_row; ++i)
        REQUIRE(std::abs(got[i] - want[r * per_row + i]) <= 2e-5f * std::max(1.f, want[r * per_row + i]));
    }
    // The distance as the loss's ops compute it, summed in double.
    const Tensor mx = stft.magnitude(x), my = stft.magnitude(y);
    const std::vector<float> terms =
        add(abs(sub(log(add(mx, 1e-5f)), log(add(my, 1e-5f)))), abs(sub(mx, my))).to_vector<float>();
    double want_sum = 0;
    for (float t : terms) want_sum += t;
    const SumCount d = stft_distance(stft, x, y);
    CHECK(d.count == static_cast<double>(terms.size()));
    CHECK(d.sum == doctest::Approx(want_sum).epsilon(1e-4));
    CHECK(stft_distance(stft, x, x).sum == 0.0);
    // A clip's sum does not depend on the batch it came in (validation adds
    // clips across chunks and ranks): the batch's sum is row 0's plus row
    // 1's, each scored alone against its precomputed reference, bit for bit.
    SumCount rows;
    for (int64_t r = 0; r < 2; ++r) {
      const SumCount one_row =
          stft_distance_against(stft, stft_reference(stft, hx.data() + r * len, len), hy.data() + r * len, len);
      rows.sum += one_row.sum;
      rows.count += one_row.count;
    }
    CHECK(d.sum == rows.sum);
    CHECK(d.count == rows.count);
  }
  const int64_t len = 1600;
  LogMel mel(8000, 256, 64, 40);
  const Tensor x = rand_uniform({2, len}, gen, -1.f, 1.f), y = add(x, rand_uniform({2, len}, gen, -0.1f, 0.1f));
  const std::vector<float> want = mel(x).to_vector<float>(), hx = x.to_vector<float>(), hy = y.to_vector<float>();
  const size_t per_row = want.size() / 2;
  for (int64_t r = 0; r < 2; ++r) {
    const std::vector<float> got = mel.host(hx.data() + r * len, len);
    REQUIRE(got.size() == per_row);
    for (size_t i = 0; i < per_row; ++i)
      REQUIRE(std::abs(got[i] - want[r * per_row + i]) <= 1e-4f * std::max(1.f, std::abs(want[r * per_row + i])));
  }
  const std::vector<float> terms = abs(sub(mel(x), mel(y))).to_vector<float>();
  double want_sum = 0;
  for (float t : terms) want_sum += t;
  const SumCount l1 = log_mel_l1(mel, x, y);
  CHECK(l1.sum == doctest::Approx(want_sum).epsilon(1e-3));
  // As for the STFT distance: the batch's sum is its rows' in order.
  const SumCount row0 = log_mel_l1_against(mel, mel.host(hx.data(), len), hy.data(), len);
  const SumCount row1 = log_mel_l1_against(mel, mel.host(hx.data() + len, len), hy.data() + len, len);
  CHECK(l1.sum == row0.sum + row1.sum);
  CHECK(l1.count == row0.count + row1.count);
}

TEST_CASE("spectral: StoiLoss takes STOI's bands and a 25.6 ms-like window at the training rate") {
  CHECK(StoiLoss(8000).stft().n_fft() == 256);   // 204.8 samples: 256 is nearer than 128
  CHECK(StoiLoss(8000).stft().hop() == 64);
  CHECK(StoiLoss(10000).stft().n_fft() == 256);  // STOI's own frame
  CHECK(StoiLoss(16000).stft().n_fft() == 512);
  CHECK(StoiLoss(8000).bands() == 15);   // the top band (3.4 to 4.3 kHz) reaches past 4 kHz, kept to the Nyquist bin
  CHECK(StoiLoss(16000).bands() == 15);  // STOI's 15 and no more: the bands stop at STOI's last
  CHECK(StoiLoss(4000).bands() == 12);   // band 12's lower edge, 2.0 kHz, is the Nyquist frequency
  // The formula STOI's own bands use, here at 10 kHz and 512 points: 150 Hz
  // has edges 133.6 and 168.4 Hz, bins 7 and 9 (19.5 Hz apart).
  CHECK(third_octave_bins(0, 10000, 512).lo == 7);
  CHECK(third_octave_bins(0, 10000, 512).hi == 9);
  CHECK_THROWS_WITH_AS(StoiLoss(0), doctest::Contains("sample rate must be positive"), Error);
}

TEST_CASE("spectral: StoiLoss is near 0 for y == x and any gain, near 1 for unrelated noise, and keeps N == 0 graphs") {
  Generator gen(8, 1);
  // Speech-like: noise under a syllable-rate envelope, so every band's
  // envelope moves.
  std::vector<float> v(2 * 1600);
  for (size_t t = 0; t < v.size(); ++t)
    v[t] = (0.6f + 0.5f * std::sin(0.012f * static_cast<float>(t))) * (gen.uniform() - 0.5f);
  Tensor x = from_vector(v, {2, 1600});
  StoiLoss loss(8000);
  const float same = loss(x, x, one).item<float>();
  CHECK(same >= 0.f);
  CHECK(same < 0.02f);  // the eps in the variances keeps it just above 0
  CHECK(std::abs(loss(x, mul(x, 3.f), one).item<float>() - same) < 0.01f);  // a correlation: gain is free
  Tensor other = rand_uniform({2, 1600}, gen, -0.3f, 0.3f);
  CHECK(loss(x, other, one).item<float>() > 0.7f);
  // Half of x's bands lost costs about half the loss of losing them all:
  // x lowpassed by a 2-tap mean (a zero at 4 kHz) keeps the low bands.
  std::vector<float> low(v.size());
  for (size_t t = 0; t < v.size(); ++t) low[t] = 0.5f * (v[t] + (t % 1600 ? v[t - 1] : 0.f));
  const float lowpassed = loss(x, from_vector(low, {2, 1600}), one).item<float>();
  CHECK(lowpassed > same);
  CHECK(lowpassed < loss(x, other, one).item<float>());
  Tensor e = zeros({0, 1600}).set_requires_grad(true), y = zeros({0, 1600}).set_requires_grad(true);
  Tensor l = loss(e, y, one);
  l.backward();
  CHECK(y.grad().defined());
  CHECK(e.grad().defined());
  CHECK_THROWS_WITH_AS(loss(zeros({1, 200}), zeros({1, 200}), one), doctest::Contains("256"), Error);
}

TEST_CASE("spectral: gradcheck of StoiLoss, and the same bits on the simulated device") {
  // At 625 Hz the window is 16 samples (hop 4) and four bands fit: a loss
  // small enough to difference element by element.
  StoiLoss loss(625);
  REQUIRE(loss.stft().n_fft() == 16);
  REQUIRE(loss.bands() == 4);
  Tensor ref = param({2, 48}, 77, -1.f, 1.f).detach();
  Tensor y = param({2, 48}, 78, -1.f, 1.f);
  check_gradient("stoi loss", [&](const std::vector<Tensor>& in) { return loss(ref, in[0], one); }, {y}, 1e-3);
  CHECK(loss(ref.to(Device::sim()), y.detach().to(Device::sim()), one).to(Device::cpu()).item<float>() ==
        loss(ref, y.detach(), one).item<float>());
}
