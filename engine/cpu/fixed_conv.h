// The CPU's direct convolutions and their exact-step gradients: straight
// from the (zero-padded) input, with no im2col buffer, for any plan (any
// strides, padding and dilation; a 1-D convolution is the plan with h = 1).
// Each gives the bits of conv_plan.h's
// per-element formulas, which are those of the column path (im2col, the
// fixed-order GEMM, col2im): the CPU kernel table's conv_fixed entries
// (cpu_kernels.cpp) take these where they pay.
// Internal header: not installed with the library (the CPU kernels' convolutions).
#pragma once

#include <cstdint>

#include "engine/conv_plan.h"

namespace vqddp {

// Which of the kernels below beat the column path on this plan (the main
// job's and bench_conv1d's plans, measured; each kernel takes any plan and
// gives the same bits). They vectorize along output rows (fixed_conv) and
// input rows (fixed_conv_data), so a 2-D plan with rows narrower than 6
// fills too little of a tile (0.3-0.7x at width 2) unless its kernel is
// one column wide with no width padding (a period discriminator's): such a
// plan runs as a 1-D convolution over its flattened planes. With a width
// stride sw the rows go by phases, ow positions a row forward and w / sw
// an input phase backward: the forward pays from 45 positions (1.14-1.46x at
// 47-200; 0.97x at 40, 0.9x at the STFT's 22), the input gradient from 64 positions and
// 4 channels (1.06-1.18x for the codec's 8 -> 64 stride-8 convolution; 0.1-0.4x
// for the STFT's single channel and at 40 positions). Re-measured on a Zen 4
// host (bench_conv2d, against the table's batched column path): at the
// codec's 40 positions 1.01x forward, 0.51x input gradient. The weight
// gradient, since its tiles write the partials in place (no [ck, o_pad]
// copy transposed after) and split like its padding, pays from 15
// positions a sample, 8 input channels and up to 960 columns c kw (Zen 5,
// 2 threads, 16-32 samples: 1.1-1.95x on eleven such plans, the codec's
// and the large config's among them; 0.34-0.55x at 10 positions, 0.48x at
// 1024 columns, 0.75-1.05x for the STFT's single channel).
// Without a width stride fixed_conv_weight pays wherever it applies.
struct DirectConvPaths {
  bool forward = false, data = false, weight = false;
};
DirectConvPaths direct_conv_paths(const ConvPlan& p);

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
