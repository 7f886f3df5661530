#include "engine/cpu/fixed_conv.h"

#include <algorithm>
#include <vector>

#include "engine/core/error.h"
#include "engine/cpu/gemm_isa.h"
#include "engine/cpu/parallel.h"

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

// The input as the taps read it: x [n, c, h, w] into planes of hp rows,
// each row the padded columns q = 0, 1, ... (x's column q - pw, 0 in the
// padding) split into sw phases of wq floats: column q at (q % sw) wq +
// q / sw. Output position ox of tap kx reads column ox sw + kx dw, which is
// position ox + kx dw / sw of phase kx dw % sw: for every tap, an output
// row's positions read consecutive floats, whatever the width stride (with
// sw = 1, one phase: the padded row itself). Exactly the rows and columns
// some tap reads, and `slack` zeros after the last plane for the forward
// kernel's lanes past an output row's end (their results are dropped).
// off[(ch, ky, kx)] is where that tap of output (0, 0) reads, relative to
// its sample's first plane.
struct PaddedInput {
  int64_t hp = 0, wq = 0, wp = 0;  // wp = sw wq: one padded row's floats
  const float* data = nullptr;
  const int64_t* off = nullptr;
  int64_t plane() const { return hp * wp; }
};

PaddedInput pad_input(const ConvPlan& p, const float* x, int64_t slack) {
  thread_local std::vector<float> padded_v;
  thread_local std::vector<int64_t> off_v;
  PaddedInput in;
  in.hp = (p.oh - 1) * p.sh + (p.kh - 1) * p.dh + 1;
  in.wq = p.ow + (p.kw - 1) * p.dw / p.sw;  // sw wq >= (ow - 1) sw + (kw - 1) dw + 1 columns
  in.wp = p.sw * in.wq;
  const int64_t rows = p.n * p.c * in.hp;
  int64_t* off = cpu::scratch(off_v, p.col_width());
  for (int64_t ch = 0; ch < p.c; ++ch)
    for (int64_t ky = 0; ky < p.kh; ++ky)
      for (int64_t kx = 0; kx < p.kw; ++kx)
        off[(ch * p.kh + ky) * p.kw + kx] =
            ch * in.plane() + ky * p.dh * in.wp + kx * p.dw % p.sw * in.wq + kx * p.dw / p.sw;
  in.off = off;
  // No padding, one phase, every row and column read and no slack (the 1x1
  // convolutions' weight gradient): the layout is x's own, so read x in
  // place rather than copy it float for float.
  if (slack == 0 && p.sw == 1 && p.ph == 0 && p.pw == 0 && in.hp == p.h && in.wp == p.w) {
    in.data = x;
    return in;
  }
  float* padded = cpu::scratch(padded_v, rows * in.wp + slack);
  parallel_for_ranges(rows, in.wp, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t plane = row / in.hp, iy = row % in.hp - p.ph;
      float* to = padded + row * in.wp;
      if (iy < 0 || iy >= p.h) {
        std::fill_n(to, in.wp, 0.f);
        continue;
      }
      const float* from = x + (plane * p.h + iy) * p.w;
      if (p.sw > 1) {
        for (int64_t r = 0; r < p.sw; ++r)
          for (int64_t i = 0; i < in.wq; ++i) {
            const int64_t col = i * p.sw + r - p.pw;
            to[r * in.wq + i] = col >= 0 && col < p.w ? from[col] : 0.f;
          }
        continue;
      }
      // Columns q < pw and q >= pw + w are padding, the rest x's row: one
      // copy between two fills, not a bounds test per float.
      const int64_t lo = std::min(p.pw, in.wp), hi = std::max(lo, std::min(p.pw + p.w, in.wp));
      std::fill(to, to + lo, 0.f);
      std::copy(from + (lo - p.pw), from + (hi - p.pw), to + lo);
      std::fill(to + hi, to + in.wp, 0.f);
    }
  });
  std::fill_n(padded + rows * in.wp, slack, 0.f);
  in.data = padded;
  return in;
}

// The longest phase of an input row of a plan with width stride sw: the
// input gradient's row length (conv_data_rows).
int64_t phase_length(const ConvPlan& p) { return (p.w + p.sw - 1) / p.sw; }

void check_plan(const ConvPlan& p, int64_t cout, const char* what) {
  VQDDP_CHECK(p.sw >= 1 && p.n >= 0 && p.c >= 1 && cout >= 1 && p.oh >= 1 && p.ow >= 1,
              "{}: not a convolution the direct kernels take: input [{}, {}, {}, {}], {} output channels, "
              "kernel ({}, {}), stride ({}, {})",
              what, p.n, p.c, p.h, p.w, cout, p.kh, p.kw, p.sh, p.sw);
}

// Output row (s, oy) is a stride-1 1-D convolution over the padded planes:
// tap (ch, ky, kx) reads ow consecutive floats from row oy sh + ky dh of
// plane ch, so the row kernel (conv1d_sample) reads them in place.
void conv_rows(const ConvPlan& p, const float* x, int64_t cout, const float* w, float* y) {
  if (p.n == 0) return;
  const cpu::GemmIsa& kernels = isa_for_columns(p.ow);
  const PaddedInput in = pad_input(p, x, kernels.nr);
  const int64_t blocks = (cout + kernels.mr - 1) / kernels.mr, positions = p.oh * p.ow;
  parallel_for_ranges(p.n * p.oh * blocks, p.col_width() * p.ow * kernels.mr / 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t s = t / (p.oh * blocks), oy = t / blocks % p.oh, b = t % blocks;
      cpu::Conv1dArgs args;
      args.o_begin = b * kernels.mr;
      args.o_end = std::min(cout, args.o_begin + kernels.mr);
      args.ck = p.col_width();
      args.lout = p.ow;
      args.y_stride = positions;
      args.xp = in.data + s * p.c * in.plane() + oy * p.sh * in.wp;
      args.off = in.off;
      args.w = w;
      args.y = y + s * cout * positions + oy * p.ow;
      kernels.conv1d(args);
    }
  });
}

// Input row (s, iy) gathers, for each tap (ky, kx) ascending whose output
// row oy = (iy + ph - ky dh) / sh exists, the chains of output row oy's
// gradient, and adds them in double in that order, col2im's. With a width
// stride the row goes by phases: column ix = i sw + r takes tap kx where
// ix + pw - kx dw is a multiple of sw, the same taps for every i of phase r
// (kx dw = r + pw mod sw), from output ox = i + (r + pw - kx dw) / sw, so
// each phase is a stride-1 gather over its taps with the gradient shifted
// by (r + pw - kx dw) / sw (with sw = 1, one phase: the row, every tap).
// One call of the row kernel (conv1d_data) per input row and phase, with
// the phase's taps listed, writes the row's channels of dx [n, c, h, w]
// (a phase through a buffer, its columns sw apart in dx).
void conv_data_rows(const ConvPlan& p, int64_t cout, const float* g, const float* w, float* dx) {
  if (p.n == 0) return;
  const int64_t lq = phase_length(p);
  const cpu::GemmIsa& kernels = isa_for_columns(lq);
  // Each output row's gradient at `left` of a row of lg floats, zero
  // around: tap kx of phase r reads i at left + (r + pw - kx dw) / sw + i
  // (up to nr - 1 lanes past the last i), and a position outside the
  // output reads 0, whose chain is +0 for finite weights and adds nothing
  // (the column path skips it: an infinite weight gives NaN here, not
  // there). The row holds all ow outputs even where padding wider than the
  // kernel puts some beyond every read.
  const int64_t left = ((p.kw - 1) * p.dw + p.sw - 1) / p.sw;
  const int64_t lg = left + std::max(p.ow, (p.sw - 1 + p.pw) / p.sw + lq + kernels.nr + 1);
  thread_local std::vector<float> padded_v;
  float* padded = cpu::scratch(padded_v, p.n * cout * p.oh * lg);
  pad_rows(p.n * cout * p.oh, p.ow, g, left, lg, padded);
  const int64_t blocks = (p.c + kernels.mr - 1) / kernels.mr;
  parallel_for_ranges(p.n * p.h * blocks, p.kh * p.kw * cout * p.w * kernels.mr / (16 * p.sh * p.sw),
                      [&](int64_t begin, int64_t end) {
    std::vector<int64_t> taps(p.kh * p.kw);  // one range's lists: no allocation per row
    std::vector<const float*> rows(p.kh * p.kw);
    std::vector<float> phase(p.sw > 1 ? kernels.mr * lq : 0);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t s = task / (p.h * blocks), iy = task / blocks % p.h, b = task % blocks;
      const int64_t ch_begin = b * kernels.mr, ch_end = std::min(p.c, ch_begin + kernels.mr);
      float* dx_row = dx + (s * p.c * p.h + iy) * p.w;
      for (int64_t r = 0; r < std::min(p.sw, p.w); ++r) {
        cpu::Conv1dDataArgs args;
        args.o = cout;
        args.l = (p.w - r + p.sw - 1) / p.sw;
        args.lg = p.oh * lg;  // from one output channel's rows to the next's
        args.ck = p.col_width();
        args.k = p.kh * p.kw;
        for (int64_t ky = 0; ky < p.kh; ++ky) {  // taps ascending: each element's double sum in col2im's order
          const int64_t ty = iy + p.ph - ky * p.dh;
          if (ty < 0 || ty % p.sh != 0 || ty / p.sh >= p.oh) continue;
          for (int64_t kx = 0; kx < p.kw; ++kx) {
            const int64_t shift = r + p.pw - kx * p.dw;  // a multiple of sw (negative too) or not this phase's
            if (shift % p.sw != 0) continue;
            taps[args.taps] = ky * p.kw + kx;
            rows[args.taps++] = padded + (s * cout * p.oh + ty / p.sh) * lg + left + shift / p.sw;
          }
        }
        args.tap = taps.data();
        args.gp = rows.data();
        if (p.sw == 1) {
          args.ch_begin = ch_begin, args.ch_end = ch_end, args.w = w;
          args.dx = dx_row, args.dx_stride = p.h * p.w;
          kernels.conv1d_data(args);
          continue;
        }
        // The block's channels as channels 0.. of the phase buffer: w from
        // the block's first channel on.
        args.ch_begin = 0, args.ch_end = ch_end - ch_begin, args.w = w + ch_begin * args.k;
        args.dx = phase.data(), args.dx_stride = lq;
        kernels.conv1d_data(args);
        for (int64_t ch = ch_begin; ch < ch_end; ++ch) {
          const float* from = phase.data() + (ch - ch_begin) * lq;
          float* to = dx_row + ch * p.h * p.w + r;
          for (int64_t i = 0; i < args.l; ++i) to[i * p.sw] = from[i];
        }
      }
    }
  });
}

// A kernel one column wide with no width padding (a period discriminator's)
// reads, for output (oy, ox), input column ox of rows oy sh - ph + ky dh:
// in the plane flattened row-major, position (oy sh) w + ox of a 1-D
// convolution with kh taps dilated by dh w and padded by ph w. With sh = 1
// that 1-D convolution is the plan itself, one long row instead of oh rows
// of width w; with sh > 1 it computes every sh-th output row of it too, the
// same chains, so the plan's rows are picked from it. Taken where that
// fills more of a tile than the plan's own rows do (sh w up to 16, the
// narrowest tile's width: the period discriminators' stride-3 convolutions
// at periods 2 to 5, and all their stride-1 ones).
bool flattens(const ConvPlan& p) {
  return p.kw == 1 && p.pw == 0 && p.sw == 1 && p.h > 1 && (p.sh == 1 || p.sh * p.w <= 16);
}

ConvPlan flattened(const ConvPlan& p) {
  ConvPlan f;
  f.n = p.n, f.c = p.c, f.w = p.h * p.w, f.kw = p.kh, f.pw = p.ph * p.w, f.dw = p.dh * p.w;
  f.oh = 1, f.ow = conv_output_size(f.w, f.kw, 1, f.pw, f.dw);  // w (h + 2 ph - dh (kh - 1)) >= ((oh - 1) sh + 1) w
  return f;
}

}  // namespace

DirectConvPaths direct_conv_paths(const ConvPlan& p) {
  DirectConvPaths paths;
  const bool rows_fill = p.h == 1 || p.ow >= 6 || flattens(p);
  if (p.sw == 1) {
    paths.forward = paths.data = rows_fill;
    paths.weight = true;
    return paths;
  }
  paths.forward = rows_fill && p.ow >= 45;
  paths.data = rows_fill && phase_length(p) >= 64 && p.c >= 4;
  paths.weight = p.oh * p.ow >= 15 && p.col_width() <= 960 && p.c >= 8;
  return paths;
}

void fixed_conv(const ConvPlan& p, const float* x, int64_t cout, const float* w, float* y) {
  check_plan(p, cout, "fixed_conv");
  if (!flattens(p)) return conv_rows(p, x, cout, w, y);
  const ConvPlan f = flattened(p);
  if (p.sh == 1) return conv_rows(f, x, cout, w, y);  // the same [n, cout, oh w]
  thread_local std::vector<float> all_v;
  float* all = cpu::scratch(all_v, p.n * cout * f.ow);
  conv_rows(f, x, cout, w, all);
  parallel_for_ranges(p.n * cout * p.oh, p.w, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {  // row (s, co, oy) of y: row oy sh of the 1-D output
      const int64_t plane = row / p.oh, oy = row % p.oh;
      std::copy_n(all + plane * f.ow + oy * p.sh * p.w, p.w, y + row * p.w);
    }
  });
}

// Sample s's chain runs over its output rows, each a run of ow positions
// whose taps read consecutive floats: the weight kernel's "samples" are the
// rows (sh wp floats apart), its unit the sample.
void fixed_conv_weight(const ConvPlan& p, const float* x, int64_t cout, const float* g, float* partials) {
  check_plan(p, cout, "fixed_conv_weight");
  if (p.n == 0) return;
  const int64_t ck = p.col_width(), positions = p.oh * p.ow;
  const cpu::GemmIsa& kernels = isa_for_columns(cout);
  // One vector a row of g where the channels fit in it (the kernel's
  // narrow tiles, twice as many rows j each), else whole register tiles.
  const bool narrow = cout <= kernels.nr / 2;
  const int64_t o_pad = narrow ? kernels.nr / 2 : (cout + kernels.nr - 1) / kernels.nr * kernels.nr;
  const int64_t rows_j = narrow ? 2 * kernels.mr : kernels.mr;
  const PaddedInput in = pad_input(p, x, 0);
  thread_local std::vector<float> rows_v;
  // g [n, cout, positions] as rows [n positions, o_pad], zero past cout: the tile's loads.
  float* rows = cpu::scratch(rows_v, p.n * positions * o_pad);
  // In blocks of 16 positions: each channel's run is read in order and the
  // block's rows stay in cache while its columns are written.
  constexpr int64_t kBlock = 16;
  const int64_t pos_blocks = (positions + kBlock - 1) / kBlock;
  parallel_for_ranges(p.n * pos_blocks, o_pad * kBlock, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t s = t / pos_blocks, i0 = t % pos_blocks * kBlock, i1 = std::min(positions, i0 + kBlock);
      float* block = rows + (s * positions + i0) * o_pad;
      kernels.transpose(g + s * cout * positions + i0, positions, cout, i1 - i0, block, o_pad);
      for (int64_t i = i0; i < i1; ++i) std::fill(block + (i - i0) * o_pad + cout, block + (i - i0 + 1) * o_pad, 0.f);
    }
  });
  const int64_t blocks = (ck + rows_j - 1) / rows_j;
  // Contiguous ranges of (sample, block), as the padding and the reshuffle
  // of g above split theirs: a thread's tiles read the samples it padded
  // and reshuffled, from its own core's caches, where parallel_for's task
  // by task had each core read half of them from the other's (the main job
  // at --world 1 on 2 cores: conv2d backward 7.0-7.2 -> 5.9-6.0 ms a step;
  // the 64 -> 64 k3 gradient alone 0.25 -> 0.24 ms). Each tile writes its
  // columns j of the sample's partial [cout, ck] itself.
  parallel_for_ranges(p.n * blocks, rows_j * positions * o_pad, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t s = t / blocks, b = t % blocks;
      cpu::Conv1dWeightArgs args;
      args.j_begin = b * rows_j;
      args.j_end = std::min(ck, args.j_begin + rows_j);
      args.o_pad = o_pad;
      args.samples = p.oh;
      args.lout = p.ow;
      args.sample_stride = p.sh * in.wp;
      args.cout = cout;
      args.ck = ck;
      args.xp = in.data + s * p.c * in.plane();
      args.off = in.off;
      args.g = rows + s * positions * o_pad;
      args.out = partials + s * cout * ck;
      kernels.conv1d_weight(args);
    }
  });
}

void fixed_conv_data(const ConvPlan& p, int64_t cout, const float* g, const float* w, float* dx) {
  check_plan(p, cout, "fixed_conv_data");
  if (!flattens(p)) return conv_data_rows(p, cout, g, w, dx);
  const ConvPlan f = flattened(p);
  if (p.sh == 1) return conv_data_rows(f, cout, g, w, dx);
  // g on the 1-D convolution's every row: zero where the plan has no output
  // row, and a position that reads a zero gradient adds a +0 chain, nothing
  // (for finite weights, as in conv_data_rows).
  thread_local std::vector<float> all_v;
  float* all = cpu::scratch(all_v, p.n * cout * f.ow);
  const int64_t rows = f.ow / p.w;
  parallel_for_ranges(p.n * cout * rows, p.w, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t plane = row / rows, r = row % rows;
      float* to = all + row * p.w;
      if (r % p.sh == 0 && r / p.sh < p.oh)
        std::copy_n(g + (plane * p.oh + r / p.sh) * p.w, p.w, to);
      else
        std::fill_n(to, p.w, 0.f);
    }
  });
  conv_data_rows(f, cout, all, w, dx);
}

}  // namespace vqddp
