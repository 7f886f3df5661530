// The VQ layer's per-element formulas, shared by the CPU kernels
// (vq/kernels/cpu/cpu_vq_kernels.cpp, which the simulated device runs too) and the CUDA
// kernels (vq/kernels/cuda/vq_kernels.cu): one definition each, so the backends
// cannot drift apart. Plain C++ for g++, __host__ __device__ under nvcc
// (VQDDP_HD, engine/kernel_math.h). The float arithmetic uses kernel_math.h's
// *_rn helpers, so nvcc cannot contract it into FMAs: the GPU rounds after
// every operation in the written order, as the CPU does.
// Internal header: not installed with the library (the VQ kernels' formulas).
#pragma once

#include <stdint.h>

#include "engine/kernel_math.h"

namespace vqddp {

// EMA step 6: decay * old + (1 - decay) * batch, each product rounded.
VQDDP_HD float ema_mix(float decay, float keep, float old, double batch) {
  return add_rn(mul_rn(decay, old), mul_rn(keep, static_cast<float>(batch)));
}

// EMA step 7: the Laplace-smoothed size of a code, (cs + eps) / (n + K eps) * n
// in double, rounded once; `denom` = n + K eps.
VQDDP_HD float smoothed_size(float cs, float eps, double n, double denom) {
  return static_cast<float>(static_cast<double>(add_rn(cs, eps)) / denom * n);
}

// The assignment's per-code bias for Euclidean distance: |e|^2 of a code's
// d values, summed in ascending order in double (each product of floats is
// exact there) and rounded once. Cosine assignment uses bias 0.
VQDDP_HD float code_bias(const float* e, int64_t d) {
  double acc = 0.0;
  for (int64_t j = 0; j < d; ++j) acc = add_rn(acc, mul_rn(static_cast<double>(e[j]), static_cast<double>(e[j])));
  return static_cast<float>(acc);
}

// FSQ: the index digit of a rounded code value c in [-1, 1] scaled by its
// level's half width hw: round(c * hw + hw) (an integer in [0, L)).
VQDDP_HD int64_t fsq_digit(float code, float half_width) {
  return static_cast<int64_t>(::llroundf(add_rn(mul_rn(code, half_width), half_width)));
}

// FSQ: the code value of digit q of a level with half width hw: (q - hw) / hw.
VQDDP_HD float fsq_value(int64_t digit, float half_width) {
  return div_rn(sub_rn(static_cast<float>(digit), half_width), half_width);
}

// LFQ: bit b (most significant first) of an index with `bits` bits as a
// code value: +scale or -scale.
VQDDP_HD float lfq_value(int64_t index, int64_t bits, int64_t b, float scale) {
  return (index >> (bits - 1 - b)) & 1 ? scale : -scale;
}

// The revival candidate a code takes: the j-th expired code takes draw j of
// the list drawn without replacement when the global batch has at least m
// rows for the m expired codes, of the list drawn with replacement when it
// has fewer (sampler.h: the sampler's rule, decided here on the device).
VQDDP_HD int64_t revival_row(int64_t j, int64_t expired, int64_t total_rows, const int64_t* without_replacement,
                             const int64_t* with_replacement) {
  return expired <= total_rows ? without_replacement[j] : with_replacement[j];
}

}  // namespace vqddp
