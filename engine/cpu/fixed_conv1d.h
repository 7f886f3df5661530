// The stride-1, one-group 1-D convolution on the CPU and its exact-step
// gradients, straight from the input (no im2col buffer), each with the bits
// of the fixed-order product (fixed_gemm.h) of the im2col formulation: the
// CPU kernel table's conv_fixed entries for 1-D plans (cpu_kernels.cpp).
// Internal header: not installed with the library (the CPU kernels' convolutions).
#pragma once

#include <cstdint>
#include <vector>

namespace vqddp {

// A 1-D convolution with stride 1 and no groups, straight from its input:
// y [n, o, lout] with lout = l + 2 pad - dil (k - 1) >= 1 and
//   y[s, j, i] = chain over p = (ch, t) ascending of w[j, ch, t] * x[s, ch, i - pad + t dil]
// (0 outside x): the fixed_gemm chain of unfold(x) [n lout, c k] times
// w^T [c k, o], so the same bits as that product, with no im2col buffer
// and the result already in [n, o, lout]. Threads: over samples and blocks
// of output channels.
void fixed_conv1d(int64_t n, int64_t c, int64_t l, const float* x, int64_t o, int64_t k, int64_t pad, int64_t dil,
                  const float* w, float* y);

// The weight gradient of fixed_conv1d as an exact step's unit partials
// (engine/exact_batch.h): partials [units, o, c k] with unit u's entry
//   chain over its rows r = (s, i) ascending of g[s, j, i] * x[s, ch, i - pad + t dil]
// for (j, (ch, t)), where g [n, o, lout] is the output's gradient and the
// units hold unit_examples consecutive samples each: the unit GEMMs of
// matmul's backward on unfold(x) and g's rows, so their bits, with no
// im2col buffer.
void fixed_conv1d_weight_units(int64_t n, int64_t c, int64_t l, const float* x, int64_t o, int64_t k, int64_t pad,
                               int64_t dil, const float* g, const std::vector<int64_t>& unit_examples,
                               float* partials);

// The input gradient of fixed_conv1d in an exact step: dx [n, c, l] from
// g [n, o, lout] and w [o, c k], each element the double sum over taps t
// ascending of the fixed chain over q ascending of g[s, q, i] w[q, ch k + t]
// (i = iy + pad - t dil, taps outside the output left out), rounded once:
// fold of the fixed_gemm product g_rows w, so its bits, with neither the
// [n lout, c k] product nor g's transpose written.
void fixed_conv1d_data(int64_t n, int64_t c, int64_t l, int64_t o, int64_t k, int64_t pad, int64_t dil, const float* g,
                       const float* w, float* dx);

}  // namespace vqddp
