// The CPU's direct convolutions and their exact-step gradients: straight
// from the (zero-padded) input, with no im2col buffer, for every plan whose
// width stride is 1 (any height stride, padding and dilation; a 1-D
// convolution is the plan with h = 1). Each gives the bits of conv_plan.h's
// per-element formulas, which are those of the column path (im2col, the
// fixed-order GEMM, col2im): the CPU kernel table's conv_fixed entries
// (cpu_kernels.cpp) take these where they apply.
// Internal header: not installed with the library (the CPU kernels' convolutions).
#pragma once

#include <cstdint>

#include "engine/conv_plan.h"

namespace vqddp {

// Whether the kernels below take this plan: a width stride of 1, so an
// output row's positions read consecutive input floats for every tap.
bool direct_conv_applies(const ConvPlan& p);

// Whether fixed_conv and fixed_conv_data beat the column path on this plan
// (bench_conv2d). They vectorize along output rows, so a 2-D plan with rows
// narrower than 6 fills too little of a tile (0.3-0.7x at width 2) unless
// its kernel is one column wide with no width padding (a period
// discriminator's): such a plan runs as a 1-D convolution over its
// flattened planes. fixed_conv_weight accumulates along the rows instead
// and pays wherever it applies.
bool direct_conv_pays(const ConvPlan& p);

// y [n, cout, oh, ow] with y[s, co, oy, ox] = conv_output_value without the
// bias: the chain over (ch, ky, kx) ascending of w[co, (ch, ky, kx)] times
// the tap's input (0 in the padding). Threads: over (sample, output row,
// block of output channels), or (sample, block) for a flattened plan.
void fixed_conv(const ConvPlan& p, const float* x, int64_t cout, const float* w, float* y);

// The per-sample weight gradients [n, cout, c kh kw]: conv_weight_value,
// sample s's chain over its positions (oy, ox) ascending of g[s, co, oy,
// ox] times the tap's input, where g [n, cout, oh, ow] is the output's
// gradient. Threads: over (sample, block of (ch, ky, kx)).
void fixed_conv_weight(const ConvPlan& p, const float* x, int64_t cout, const float* g, float* partials);

// The input gradient dx [n, c, h, w] without a bias: conv_data_value, each
// element the double sum over its valid taps (ky, kx) ascending of the chain
// over output channels of g times w, rounded once, for finite weights (a
// tap outside the output adds a +0 chain here, which an infinite weight
// turns into NaN; the column path skips it). Threads: over (sample, input
// row, block of channels), or (sample, block) for a flattened plan.
void fixed_conv_data(const ConvPlan& p, int64_t cout, const float* g, const float* w, float* dx);

}  // namespace vqddp
