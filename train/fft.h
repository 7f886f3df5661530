// A radix-2 FFT in double precision, for the measurements that need no
// gradient (STOI's band envelopes, the held-out log-mel and STFT distances:
// train/stoi.h, train/spectral.h). Our own, not a library's: its result is
// a fixed sequence of double operations, so the scores do not depend on the
// CPU model or a planner's choice, as a SIMD-dispatching FFT's would.
// Internal header: not installed (only the measurements' sources use it).
#pragma once

#include <complex>
#include <utility>
#include <vector>

namespace vqddp {

class Fft {
 public:
  // n a power of two, at least 2 (else an error naming n).
  explicit Fft(int n);

  int size() const { return n_; }
  // x (size() points) -> its DFT, sum_n x[n] exp(-2 pi i k n / N), in place.
  void operator()(std::complex<double>* x) const;

  // Two real frames in one transform (half the FFTs): with a as the real
  // part and b as the imaginary, Z = transform(a + i b), and
  // Zc[k] = conj(Z[(N - k) mod N]), A = (Z + Zc) / 2 and B = (Z - Zc) / 2i.
  // Returns {|A[k]|^2, |B[k]|^2} from the transformed z.
  std::pair<double, double> split_power(const std::complex<double>* z, int k) const {
    const std::complex<double> a = z[k], c = std::conj(z[(n_ - k) % n_]);
    return {std::norm(a + c) / 4, std::norm(a - c) / 4};
  }

 private:
  int n_;
  std::vector<int> reversed_;
  std::vector<std::complex<double>> twiddle_;
};

}  // namespace vqddp
