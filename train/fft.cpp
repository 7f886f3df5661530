#include "train/fft.h"

#include <numbers>

#include "engine/core/error.h"

namespace vqddp {

Fft::Fft(int n) : n_(n), reversed_(static_cast<size_t>(n)), twiddle_(static_cast<size_t>(n / 2)) {
  VQDDP_CHECK(n >= 2 && (n & (n - 1)) == 0, "Fft: {} points; the FFT takes a power of two, at least 2", n);
  int bits = 0;
  while ((1 << bits) < n) ++bits;
  for (int i = 0; i < n; ++i) {
    int r = 0;
    for (int bit = 0; bit < bits; ++bit) r |= ((i >> bit) & 1) << (bits - 1 - bit);
    reversed_[i] = r;
  }
  // exp(-2 pi i k / n) for k < n / 2, each from its own angle (no
  // accumulated rounding).
  for (int k = 0; k < n / 2; ++k) twiddle_[k] = std::polar(1.0, -2 * std::numbers::pi * k / n);
}

void Fft::operator()(std::complex<double>* x) const {
  for (int i = 0; i < n_; ++i)
    if (i < reversed_[i]) std::swap(x[i], x[reversed_[i]]);
  // The butterflies in real arithmetic (std::complex's product, which
  // checks for NaN after every multiply, does not vectorize): t = w * b,
  // rounded as the complex product rounds finite values.
  double* d = reinterpret_cast<double*>(x);  // re, im pairs (the standard's layout of complex)
  const double* w = reinterpret_cast<const double*>(twiddle_.data());
  for (int half = 1; half < n_; half *= 2) {  // counted by halves: len = n_ itself never overflows int
    const int len = 2 * half, stride = n_ / len;
    for (int start = 0; start < n_; start += len)
      for (int k = 0; k < half; ++k) {
        double* a = d + 2 * (start + k);
        double* b = a + 2 * half;
        const double wr = w[2 * k * stride], wi = w[2 * k * stride + 1];
        const double tr = wr * b[0] - wi * b[1], ti = wr * b[1] + wi * b[0];
        b[0] = a[0] - tr;
        b[1] = a[1] - ti;
        a[0] += tr;
        a[1] += ti;
      }
  }
}

}  // namespace vqddp
