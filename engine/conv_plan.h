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

}  // namespace vqddp
