#include "engine/cpu/fixed_conv1d.h"

#include <algorithm>

#include "engine/conv_plan.h"
#include "engine/core/error.h"
#include "engine/cpu/gemm_isa.h"
#include "engine/parallel.h"

namespace vqddp {

using cpu::isa_for_columns;

namespace {

// Each of `rows` rows of x (l floats) into a row of lp floats: `left`
// zeros, the row, zeros to the end.
void pad_rows(int64_t rows, int64_t l, const float* x, int64_t left, int64_t lp, float* padded) {
  parallel_for_ranges(rows, lp, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      float* to = padded + row * lp;
      std::fill_n(to, left, 0.f);
      std::copy_n(x + row * l, l, to + left);
      std::fill(to + left + l, to + lp, 0.f);
    }
  });
}

// The samples' rows of x padded for a convolution (pad zeros on the left),
// and off[ch * k + t] = ch * lp + t * dil, where tap t of channel ch starts
// in a sample's padded rows.
void pad_samples(int64_t n, int64_t c, int64_t l, const float* x, int64_t k, int64_t pad, int64_t dil, int64_t lp,
                 float* padded, int64_t* off) {
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t t = 0; t < k; ++t) off[ch * k + t] = ch * lp + t * dil;
  pad_rows(n * c, l, x, pad, lp, padded);
}

}  // namespace

void fixed_conv1d_weight_units(int64_t n, int64_t c, int64_t l, const float* x, int64_t o, int64_t k, int64_t pad,
                               int64_t dil, const float* g, const std::vector<int64_t>& unit_examples,
                               float* partials) {
  const int64_t lout = conv_output_size(l, k, 1, pad, dil), ck = c * k, units = static_cast<int64_t>(unit_examples.size());
  int64_t examples = 0;
  for (int64_t e : unit_examples) examples += e;
  VQDDP_CHECK(examples == n && c >= 1 && o >= 1 && k >= 1 && lout >= 1, "fixed_conv1d_weight_units: units of {} "
              "examples for {} samples, or no output for input [{}, {}, {}] and kernel {}", examples, n, n, c, l, k);
  const cpu::GemmIsa& kernels = isa_for_columns(o);
  const int64_t lp = lout + dil * (k - 1), o_pad = (o + kernels.nr - 1) / kernels.nr * kernels.nr;
  thread_local std::vector<float> padded_v, rows_v, out_v;
  thread_local std::vector<int64_t> off_v;
  float* padded = cpu::scratch(padded_v, n * c * lp);
  int64_t* off = cpu::scratch(off_v, ck);
  pad_samples(n, c, l, x, k, pad, dil, lp, padded, off);
  // g [n, o, lout] as rows [n lout, o_pad], zero past o: the tile's loads.
  float* rows = cpu::scratch(rows_v, n * lout * o_pad);
  parallel_for_ranges(n, o_pad * lout, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s)
      for (int64_t i = 0; i < lout; ++i) {
        float* to = rows + (s * lout + i) * o_pad;
        for (int64_t q = 0; q < o; ++q) to[q] = g[(s * o + q) * lout + i];
        std::fill(to + o, to + o_pad, 0.f);
      }
  });
  float* out_t = cpu::scratch(out_v, units * ck * o_pad);
  std::vector<int64_t> first(units + 1, 0);
  for (int64_t u = 0; u < units; ++u) first[u + 1] = first[u] + unit_examples[u];
  const int64_t blocks = (ck + kernels.mr - 1) / kernels.mr;
  parallel_for(units * blocks, [&](int64_t t) {
    const int64_t u = t / blocks, b = t % blocks;
    cpu::Conv1dWeightArgs args;
    args.j_begin = b * kernels.mr;
    args.j_end = std::min(ck, args.j_begin + kernels.mr);
    args.o_pad = o_pad;
    args.samples = unit_examples[u];
    args.lout = lout;
    args.sample_stride = c * lp;
    args.xp = padded + first[u] * c * lp;
    args.off = off;
    args.g = rows + first[u] * lout * o_pad;
    args.out_t = out_t + u * ck * o_pad;
    kernels.conv1d_weight(args);
  });
  // [ck, o_pad] per unit -> [o, ck]: a unit without examples sums nothing, +0.
  for (int64_t u = 0; u < units; ++u)
    for (int64_t q = 0; q < o; ++q)
      for (int64_t j = 0; j < ck; ++j)
        partials[(u * o + q) * ck + j] = unit_examples[u] == 0 ? 0.f : out_t[(u * ck + j) * o_pad + q];
}

void fixed_conv1d_data(int64_t n, int64_t c, int64_t l, int64_t o, int64_t k, int64_t pad, int64_t dil, const float* g,
                       const float* w, float* dx) {
  const int64_t lout = conv_output_size(l, k, 1, pad, dil), ck = c * k;
  VQDDP_CHECK(n >= 0 && c >= 1 && o >= 1 && k >= 1 && lout >= 1, "fixed_conv1d_data: no output for input [{}, {}, {}] "
              "and kernel {}", n, c, l, k);
  if (n == 0) return;
  const cpu::GemmIsa& kernels = isa_for_columns(l);
  // Sample s's gradient rows at `left` of rows of lg floats, zero around:
  // tap t reads row q from left + pad - t dil, position iy at + iy, and a
  // position outside the output reads 0, whose chain is +0 and adds nothing.
  const int64_t left = (k - 1) * dil, lg = left + pad + l + kernels.nr + 1;
  thread_local std::vector<float> padded_v;
  thread_local std::vector<double> acc_v;
  float* padded = cpu::scratch(padded_v, n * o * lg);
  double* acc = cpu::scratch(acc_v, n * c * l);
  pad_rows(n * o, lout, g, left, lg, padded);
  const int64_t blocks = (c + kernels.mr - 1) / kernels.mr;
  parallel_for(n * blocks, [&](int64_t task) {
    const int64_t s = task / blocks, b = task % blocks;
    cpu::Conv1dDataArgs args;
    args.ch_begin = b * kernels.mr;
    args.ch_end = std::min(c, args.ch_begin + kernels.mr);
    args.o = o;
    args.l = l;
    args.lg = lg;
    args.ck = ck;
    args.k = k;
    args.w = w;
    args.acc = acc + s * c * l;
    std::fill(args.acc + args.ch_begin * l, args.acc + args.ch_end * l, 0.0);
    for (int64_t t = 0; t < k; ++t) {  // taps ascending: each element's double sum in col2im's order
      args.tap = t;
      args.gp = padded + s * o * lg + left + pad - t * dil;
      kernels.conv1d_data(args);
    }
    for (int64_t e = args.ch_begin * l; e < args.ch_end * l; ++e) dx[s * c * l + e] = static_cast<float>(args.acc[e]);
  });
}

void fixed_conv1d(int64_t n, int64_t c, int64_t l, const float* x, int64_t o, int64_t k, int64_t pad, int64_t dil,
                  const float* w, float* y) {
  const int64_t lout = conv_output_size(l, k, 1, pad, dil);
  VQDDP_CHECK(n >= 0 && c >= 1 && o >= 1 && k >= 1 && lout >= 1, "fixed_conv1d: no output for input [{}, {}, {}], "
              "kernel {}, padding {}, dilation {}", n, c, l, k, pad, dil);
  if (n == 0) return;
  const cpu::GemmIsa& kernels = isa_for_columns(lout);
  // Each row of a sample's padded input: pad zeros, the row, then zeros to
  // the end, which covers the kernel's reads of up to nr - 1 columns past
  // the last output.
  const int64_t lp = lout + dil * (k - 1) + kernels.nr;
  thread_local std::vector<float> padded_v;
  thread_local std::vector<int64_t> off_v;
  float* padded = cpu::scratch(padded_v, n * c * lp);
  int64_t* off = cpu::scratch(off_v, c * k);
  pad_samples(n, c, l, x, k, pad, dil, lp, padded, off);
  const int64_t blocks = (o + kernels.mr - 1) / kernels.mr;
  parallel_for_ranges(n * blocks, c * k * lout * kernels.mr / 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t s = t / blocks, b = t % blocks;
      cpu::Conv1dArgs args;
      args.o_begin = b * kernels.mr;
      args.o_end = std::min(o, args.o_begin + kernels.mr);
      args.ck = c * k;
      args.lout = lout;
      args.xp = padded + s * c * lp;
      args.off = off;
      args.w = w;
      args.y = y + s * o * lout;
      kernels.conv1d(args);
    }
  });
}

}  // namespace vqddp
