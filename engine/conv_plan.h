// The geometry of a convolution and its two data-movement formulas, im2col
// and col2im, shared by the CPU loops and the CUDA kernels (one definition,
// so the devices cannot disagree about which input a column reads).
//
// Everything is 2-D; a 1-D convolution is the case h = kh = 1 (stride,
// padding, dilation 1, 0, 1 along h). The image x is [n, c, h, w]; the
// columns are one row per output position (sample, oy, ox), row-major over
// [n * oh * ow, c * kh * kw] with the column index (channel, ky, kx): the
// layout a GEMM against a [c_out, c * kh * kw] weight wants.
//
//   im2col: cols[(s, oy, ox), (ch, ky, kx)] = x[s, ch, iy, ix] with
//           iy = oy * sh - ph + ky * dh, ix = ox * sw - pw + kx * dw
//           (0 where (iy, ix) lies in the padding);
//   col2im: its adjoint, x[s, ch, iy, ix] = the sum of every column entry
//           that reads (iy, ix), taps in ascending (ky, kx) order,
//           accumulated in double and rounded once.
// Each output of either is a function of one sample's values only, in a
// fixed order: batch-invariant, and the same bits on every device.
#pragma once

#include <stdint.h>

#include <tuple>

#include "engine/kernel_math.h"  // VQDDP_HD

namespace vqddp {

struct ConvPlan {
  int64_t n = 0, c = 0;    // samples, channels of the image
  int64_t h = 1, w = 0;    // image size
  int64_t kh = 1, kw = 1;  // kernel size
  int64_t sh = 1, sw = 1;  // stride
  int64_t ph = 0, pw = 0;  // zero padding on each side
  int64_t dh = 1, dw = 1;  // dilation
  int64_t oh = 0, ow = 0;  // output size (conv_output_size)

  VQDDP_HD int64_t col_width() const { return c * kh * kw; }
  // Every field, once (engine/device.h's BroadcastPlan::fields).
  auto fields() const {
    const auto& [n_, c_, h_, w_, kh_, kw_, sh_, sw_, ph_, pw_, dh_, dw_, oh_, ow_] = *this;
    return std::tuple(n_, c_, h_, w_, kh_, kw_, sh_, sw_, ph_, pw_, dh_, dw_, oh_, ow_);
  }
  VQDDP_HD int64_t rows() const { return n * oh * ow; }
};

// Output length of a convolution along one dimension (< 1: no output).
VQDDP_HD int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation) {
  return (in + 2 * pad - dilation * (kernel - 1) - 1) / stride + 1;
}

// Output length of a transposed convolution along one dimension: the input
// length of the convolution it transposes, plus output_padding.
VQDDP_HD int64_t conv_transpose_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad,
                                            int64_t dilation, int64_t output_padding) {
  return (in - 1) * stride - 2 * pad + dilation * (kernel - 1) + output_padding + 1;
}

// im2col for output position (sample s, oy, ox) and channel `ch`: writes
// the kh * kw entries cols[(s, oy, ox), (ch, ky, kx)] for every tap.
VQDDP_HD void im2col_taps_at(const float* x, const ConvPlan& p, int64_t s, int64_t oy, int64_t ox, int64_t ch,
                             float* cols) {
  const float* img = x + (s * p.c + ch) * p.h * p.w;
  float* out = cols + ((s * p.oh + oy) * p.ow + ox) * p.col_width() + ch * p.kh * p.kw;
  for (int64_t ky = 0; ky < p.kh; ++ky) {
    int64_t iy = oy * p.sh - p.ph + ky * p.dh;
    bool row_in = iy >= 0 && iy < p.h;
    for (int64_t kx = 0; kx < p.kw; ++kx) {
      int64_t ix = ox * p.sw - p.pw + kx * p.dw;
      out[ky * p.kw + kx] = row_in && ix >= 0 && ix < p.w ? img[iy * p.w + ix] : 0.f;
    }
  }
}

// The same for column row r = (s, oy, ox).
VQDDP_HD void im2col_taps(const float* x, const ConvPlan& p, int64_t r, int64_t ch, float* cols) {
  im2col_taps_at(x, p, r / (p.ow * p.oh), (r / p.ow) % p.oh, r % p.ow, ch, cols);
}

// col2im for image element `e` (flat index into [n, c, h, w]).
VQDDP_HD float col2im_value(const float* cols, const ConvPlan& p, int64_t e) {
  int64_t ix = e % p.w, iy = (e / p.w) % p.h, ch = (e / (p.w * p.h)) % p.c, s = e / (p.w * p.h * p.c);
  double acc = 0.0;
  for (int64_t ky = 0; ky < p.kh; ++ky) {
    int64_t ty = iy + p.ph - ky * p.dh;  // = oy * sh for the output row that reads iy with this tap
    if (ty < 0 || ty % p.sh != 0 || ty / p.sh >= p.oh) continue;
    int64_t oy = ty / p.sh;
    for (int64_t kx = 0; kx < p.kw; ++kx) {
      int64_t tx = ix + p.pw - kx * p.dw;
      if (tx < 0 || tx % p.sw != 0 || tx / p.sw >= p.ow) continue;
      int64_t r = (s * p.oh + oy) * p.ow + tx / p.sw;
      acc += cols[r * p.col_width() + (ch * p.kh + ky) * p.kw + kx];
    }
  }
  return static_cast<float>(acc);
}

// col2im for a whole image row (`row` = (s, ch, iy) over [n, c, h]): the
// same sums as col2im_value for each of its w elements, in the same order
// (taps ascending, in double), so the same bits; but each tap visits only
// the outputs that read this row, with no division per element (the CPU's
// loop; a GPU thread per element uses col2im_value). `acc`: w doubles.
VQDDP_HD void col2im_row(const float* cols, const ConvPlan& p, int64_t row, double* acc, float* x) {
  int64_t iy = row % p.h, ch = (row / p.h) % p.c, s = row / (p.h * p.c);
  for (int64_t ix = 0; ix < p.w; ++ix) acc[ix] = 0.0;
  for (int64_t ky = 0; ky < p.kh; ++ky) {
    int64_t ty = iy + p.ph - ky * p.dh;
    if (ty < 0 || ty % p.sh != 0 || ty / p.sh >= p.oh) continue;
    const float* base = cols + (s * p.oh + ty / p.sh) * p.ow * p.col_width() + (ch * p.kh + ky) * p.kw;
    for (int64_t kx = 0; kx < p.kw; ++kx) {
      int64_t off = kx * p.dw - p.pw;                       // ix = ox * sw + off
      int64_t ox = off >= 0 ? 0 : (-off + p.sw - 1) / p.sw;  // first ox with ix >= 0
      for (int64_t ix = ox * p.sw + off; ox < p.ow && ix < p.w; ++ox, ix += p.sw)
        acc[ix] += base[ox * p.col_width() + kx];
    }
  }
  for (int64_t ix = 0; ix < p.w; ++ix) x[row * p.w + ix] = static_cast<float>(acc[ix]);
}

// ---- the convolution itself, without the columns (DeviceKernels::conv_fixed
// and its two gradients). Each is the element the column path computes,
// with every column entry read where it is needed instead of from an
// im2col buffer: the same operations in the same order, so the same bits
// (the CPU runs engine/cpu/fixed_conv.h's direct kernels or the column
// path, a GPU thread per element these).

// Column entry ((s, oy, ox), (ch, ky, kx)): im2col_taps_at's value.
VQDDP_HD float conv_column_entry(const float* x, const ConvPlan& p, int64_t s, int64_t oy, int64_t ox, int64_t ch,
                                 int64_t ky, int64_t kx) {
  int64_t iy = oy * p.sh - p.ph + ky * p.dh, ix = ox * p.sw - p.pw + kx * p.dw;
  return iy >= 0 && iy < p.h && ix >= 0 && ix < p.w ? x[((s * p.c + ch) * p.h + iy) * p.w + ix] : 0.f;
}

// Element e of y [n, cout, oh, ow] = w [cout, c kh kw] times the columns,
// plus bias[co] (none when null): the fixed_gemm chain over the column
// index (ch, ky, kx) ascending of fma(w, entry) from +0 (padding entries
// included: a skipped fma(w, 0, -0) could flip a zero's sign), then one
// add; unfold, gemm_fixed and the bias add of the column path.
VQDDP_HD float conv_output_value(const float* x, const float* w, const float* bias, const ConvPlan& p, int64_t cout,
                                 int64_t e) {
  int64_t ox = e % p.ow, oy = (e / p.ow) % p.oh, co = (e / (p.ow * p.oh)) % cout, s = e / (p.ow * p.oh * cout);
  const float* row = w + co * p.col_width();
  float acc = 0.f;
  for (int64_t ch = 0; ch < p.c; ++ch)
    for (int64_t ky = 0; ky < p.kh; ++ky)
      for (int64_t kx = 0; kx < p.kw; ++kx, ++row) acc = fma_rn(*row, conv_column_entry(x, p, s, oy, ox, ch, ky, kx), acc);
  return bias ? add_rn(acc, bias[co]) : acc;
}

// Element e of dx [n, c, h, w] from the output gradient g [n, cout, oh, ow]:
// col2im_value of the columns' gradient, whose entry ((s, oy, ox), (ch, ky,
// kx)) is the fixed_gemm chain over co ascending of fma(g[s, co, oy, ox],
// w[co, (ch, ky, kx)]); each entry computed where col2im reads it. Plus
// bias[ch] unless null: a transposed convolution is this product (g its
// input, w its weight [c_in, c_out kh kw]), and its bias add follows.
VQDDP_HD float conv_data_value(const float* g, const float* w, const float* bias, const ConvPlan& p, int64_t cout,
                               int64_t e) {
  int64_t ix = e % p.w, iy = (e / p.w) % p.h, ch = (e / (p.w * p.h)) % p.c, s = e / (p.w * p.h * p.c);
  const int64_t positions = p.oh * p.ow;
  double acc = 0.0;
  for (int64_t ky = 0; ky < p.kh; ++ky) {
    int64_t ty = iy + p.ph - ky * p.dh;
    if (ty < 0 || ty % p.sh != 0 || ty / p.sh >= p.oh) continue;
    for (int64_t kx = 0; kx < p.kw; ++kx) {
      int64_t tx = ix + p.pw - kx * p.dw;
      if (tx < 0 || tx % p.sw != 0 || tx / p.sw >= p.ow) continue;
      const float* gp = g + s * cout * positions + (ty / p.sh) * p.ow + tx / p.sw;
      const float* wp = w + (ch * p.kh + ky) * p.kw + kx;
      float entry = 0.f;
      for (int64_t co = 0; co < cout; ++co) entry = fma_rn(gp[co * positions], wp[co * p.col_width()], entry);
      acc += entry;
    }
  }
  return bias ? add_rn(static_cast<float>(acc), bias[ch]) : static_cast<float>(acc);
}

// Element e of the per-sample weight gradients [n, cout, c kh kw]: sample
// s's chain over its positions (oy, ox) ascending of fma(g[s, co, oy, ox],
// column entry), from +0: the batched GEMM of g by the sample's columns.
VQDDP_HD float conv_weight_value(const float* x, const float* g, const ConvPlan& p, int64_t cout, int64_t e) {
  const int64_t ck = p.col_width();
  int64_t j = e % ck, co = (e / ck) % cout, s = e / (ck * cout);
  int64_t kx = j % p.kw, ky = (j / p.kw) % p.kh, ch = j / (p.kw * p.kh);
  const float* gp = g + (s * cout + co) * p.oh * p.ow;
  float acc = 0.f;
  for (int64_t oy = 0; oy < p.oh; ++oy)
    for (int64_t ox = 0; ox < p.ow; ++ox, ++gp) acc = fma_rn(*gp, conv_column_entry(x, p, s, oy, ox, ch, ky, kx), acc);
  return acc;
}

// Element e of the per-sample bias gradients [n, cout]: g's row (s, co)
// summed over its positions in ascending order, in double from 0, rounded
// once (the engine's sum of g down to [C_out, 1, 1] for one sample).
VQDDP_HD float conv_bias_value(const float* g, const ConvPlan& p, int64_t e) {
  const int64_t positions = p.oh * p.ow;
  const float* row = g + e * positions;
  double acc = 0.0;
  for (int64_t i = 0; i < positions; ++i) acc += row[i];
  return static_cast<float>(acc);
}

}  // namespace vqddp
