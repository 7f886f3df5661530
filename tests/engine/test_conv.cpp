// Convolutions (engine/ops_conv.cpp, engine/nn_conv.h): outputs against a
// direct nested-loop reference, the forward pass's batch invariance, and
// the codec activations' values. Their finite-difference gradients are in
// the op table (op_table.h, test_op_table.cpp).
#include <doctest/doctest.h>

#include <optional>
#include <tuple>
#include <algorithm>
#include <string_view>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "engine/autograd.h"
#include "engine/conv_plan.h"
#include "engine/cpu/fixed_conv.h"
#include "engine/device.h"
#include "engine/device_counters.h"
#include "engine/kernel_math.h"
#include "engine/nn_conv.h"
#include "engine/ops.h"
#include "engine/core/random.h"
#include "tests/engine/same_bits.h"

using namespace vqddp;
using vqddp::test::same_bits;

namespace {

struct Geo {
  int64_t n, cin, h, w, cout, kh, kw;
  ConvOptions o;
};

Tensor randn(const Shape& s, uint64_t seed, bool grad = false) {
  Generator g(seed, 0);
  Tensor t = rand_normal(s, g);
  t.set_requires_grad(grad);
  return t;
}

// y[s, o, oy, ox] = b[o] + sum over (c in o's group, ky, kx) of
//   w[o, c, ky, kx] x[s, g*cg + c, oy*sh - ph + ky*dh, ox*sw - pw + kx*dw].
std::vector<double> conv_reference(const Tensor& x, const Tensor& w, const Tensor& b, const Geo& g, int64_t oh,
                                   int64_t ow) {
  int64_t groups = g.o.groups, cg = g.cin / groups, og = g.cout / groups;
  std::vector<double> y(g.n * g.cout * oh * ow, 0.0);
  const float *px = x.data<float>(), *pw = w.data<float>(), *pb = b.data<float>();
  for (int64_t s = 0; s < g.n; ++s)
    for (int64_t o = 0; o < g.cout; ++o)
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          double acc = pb[o];
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t ky = 0; ky < g.kh; ++ky)
              for (int64_t kx = 0; kx < g.kw; ++kx) {
                int64_t iy = oy * g.o.stride[0] - g.o.padding[0] + ky * g.o.dilation[0];
                int64_t ix = ox * g.o.stride[1] - g.o.padding[1] + kx * g.o.dilation[1];
                if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
                int64_t ci = o / og * cg + c;
                acc += double(pw[((o * cg + c) * g.kh + ky) * g.kw + kx]) * px[((s * g.cin + ci) * g.h + iy) * g.w + ix];
              }
          y[((s * g.cout + o) * oh + oy) * ow + ox] = acc;
        }
  return y;
}

// The transposed convolution scatters: every x[s, i, iy, ix] adds
// w[i, o, ky, kx] x to y[s, g*og + o, iy*sh - ph + ky*dh, ix*sw - pw + kx*dw].
std::vector<double> conv_transpose_reference(const Tensor& x, const Tensor& w, const Tensor& b, const Geo& g,
                                             int64_t oh, int64_t ow) {
  int64_t groups = g.o.groups, cg = g.cin / groups, og = g.cout / groups;
  std::vector<double> y(g.n * g.cout * oh * ow, 0.0);
  const float *px = x.data<float>(), *pw = w.data<float>(), *pb = b.data<float>();
  for (int64_t s = 0; s < g.n; ++s)
    for (int64_t o = 0; o < g.cout; ++o)
      for (int64_t e = 0; e < oh * ow; ++e) y[(s * g.cout + o) * oh * ow + e] = pb[o];
  for (int64_t s = 0; s < g.n; ++s)
    for (int64_t i = 0; i < g.cin; ++i)
      for (int64_t iy = 0; iy < g.h; ++iy)
        for (int64_t ix = 0; ix < g.w; ++ix)
          for (int64_t o = 0; o < og; ++o)
            for (int64_t ky = 0; ky < g.kh; ++ky)
              for (int64_t kx = 0; kx < g.kw; ++kx) {
                int64_t y0 = iy * g.o.stride[0] - g.o.padding[0] + ky * g.o.dilation[0];
                int64_t x0 = ix * g.o.stride[1] - g.o.padding[1] + kx * g.o.dilation[1];
                if (y0 < 0 || y0 >= oh || x0 < 0 || x0 >= ow) continue;
                int64_t oc = i / cg * og + o;
                y[((s * g.cout + oc) * oh + y0) * ow + x0] +=
                    double(pw[((i * og + o) * g.kh + ky) * g.kw + kx]) * px[((s * g.cin + i) * g.h + iy) * g.w + ix];
              }
  return y;
}

void check_close(const Tensor& got, const std::vector<double>& want) {
  REQUIRE(got.numel() == static_cast<int64_t>(want.size()));
  const float* p = got.data<float>();
  for (size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    CHECK(std::fabs(p[i] - want[i]) <= 1e-5 + 1e-5 * std::fabs(want[i]));
  }
}

ConvOptions opts(int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t groups,
                 int64_t oph = 0, int64_t opw = 0) {
  ConvOptions o;
  o.stride = {sh, sw};
  o.padding = {ph, pw};
  o.dilation = {dh, dw};
  o.output_padding = {oph, opw};
  o.groups = groups;
  return o;
}

// The plan of a 3x4 kernel over [2, 3, 9, width] images with o's geometry.
ConvPlan plan_3x4(const ConvOptions& o, int64_t width) {
  ConvPlan p;
  p.n = 2, p.c = 3, p.h = 9, p.w = width, p.kh = 3, p.kw = 4;
  p.sh = o.stride[0], p.sw = o.stride[1], p.ph = o.padding[0], p.pw = o.padding[1];
  p.dh = o.dilation[0], p.dw = o.dilation[1];
  p.oh = conv_output_size(p.h, p.kh, p.sh, p.ph, p.dh);
  p.ow = conv_output_size(p.w, p.kw, p.sw, p.pw, p.dw);
  return p;
}

Conv1dOptions opts1(int64_t stride, int64_t pad, int64_t dil, int64_t groups, int64_t out_pad = 0) {
  return {stride, pad, dil, out_pad, groups};
}

}  // namespace

TEST_CASE("conv1d and conv2d equal a nested-loop reference with stride, padding, dilation and groups") {
  const Geo cases[] = {
      {2, 4, 1, 11, 6, 1, 3, opts(1, 2, 0, 1, 1, 1, 1)},   // 1-D, stride 2
      {3, 4, 1, 13, 4, 1, 3, opts(1, 1, 0, 2, 1, 2, 2)},   // 1-D, dilation 2, groups 2
      {1, 1, 1, 17, 3, 1, 7, opts(1, 1, 0, 3, 1, 1, 1)},   // 1-D, the codec's input conv
      {2, 6, 1, 9, 6, 1, 4, opts(1, 3, 0, 0, 1, 1, 3)},    // 1-D, groups 3, no padding
      {2, 3, 7, 6, 4, 3, 3, opts(2, 2, 1, 1, 1, 1, 1)},    // 2-D, stride 2
      {2, 4, 8, 7, 6, 3, 2, opts(1, 2, 2, 0, 2, 1, 2)},    // 2-D, dilation, groups, unequal
  };
  for (const Geo& g : cases) {
    CAPTURE(g.h);
    CAPTURE(g.w);
    CAPTURE(g.o.groups);
    Tensor x = randn({g.n, g.cin, g.h, g.w}, 1), w = randn({g.cout, g.cin / g.o.groups, g.kh, g.kw}, 2),
           b = randn({g.cout}, 3);
    Tensor y = conv2d(x, w, b, g.o);
    int64_t oh = y.size(2), ow = y.size(3);
    CHECK(oh == (g.h + 2 * g.o.padding[0] - g.o.dilation[0] * (g.kh - 1) - 1) / g.o.stride[0] + 1);
    CHECK(ow == (g.w + 2 * g.o.padding[1] - g.o.dilation[1] * (g.kw - 1) - 1) / g.o.stride[1] + 1);
    check_close(y, conv_reference(x, w, b, g, oh, ow));
    if (g.h == 1) {  // conv1d is the same computation on [N, C, L]
      Conv1dOptions o1 = opts1(g.o.stride[1], g.o.padding[1], g.o.dilation[1], g.o.groups);
      Tensor y1 = conv1d(reshape(x, {g.n, g.cin, g.w}), reshape(w, {g.cout, g.cin / g.o.groups, g.kw}), b, o1);
      CHECK(y1.shape() == Shape{g.n, g.cout, ow});
      CHECK(std::memcmp(y1.data<float>(), y.data<float>(), y.numel() * 4) == 0);
    }
  }
}

TEST_CASE("conv_transpose1d and conv_transpose2d equal a nested-loop reference, output_padding included") {
  const Geo cases[] = {
      {2, 4, 1, 5, 6, 1, 4, opts(1, 2, 0, 1, 1, 1, 1)},        // 1-D, the decoder's upsampling shape
      {2, 4, 1, 6, 2, 1, 3, opts(1, 3, 0, 0, 1, 1, 2, 0, 2)},  // 1-D, groups 2, output_padding 2
      {1, 3, 1, 7, 3, 1, 3, opts(1, 2, 0, 2, 1, 2, 1, 0, 1)},  // 1-D, dilation 2
      {2, 4, 4, 4, 3, 4, 4, opts(2, 2, 1, 1, 1, 1, 1)},        // 2-D, the VQ-VAE decoder's 2x upsampling
      {1, 4, 3, 5, 4, 3, 2, opts(2, 1, 0, 1, 1, 2, 2, 1, 0)},  // 2-D, groups, dilation, output_padding
  };
  for (const Geo& g : cases) {
    CAPTURE(g.h);
    CAPTURE(g.w);
    CAPTURE(g.o.groups);
    Tensor x = randn({g.n, g.cin, g.h, g.w}, 4), w = randn({g.cin, g.cout / g.o.groups, g.kh, g.kw}, 5),
           b = randn({g.cout}, 6);
    Tensor y = conv_transpose2d(x, w, b, g.o);
    int64_t oh = y.size(2), ow = y.size(3);
    CHECK(oh == (g.h - 1) * g.o.stride[0] - 2 * g.o.padding[0] + g.o.dilation[0] * (g.kh - 1) + g.o.output_padding[0] + 1);
    CHECK(ow == (g.w - 1) * g.o.stride[1] - 2 * g.o.padding[1] + g.o.dilation[1] * (g.kw - 1) + g.o.output_padding[1] + 1);
    check_close(y, conv_transpose_reference(x, w, b, g, oh, ow));
    if (g.h == 1) {
      Conv1dOptions o1 = opts1(g.o.stride[1], g.o.padding[1], g.o.dilation[1], g.o.groups, g.o.output_padding[1]);
      Tensor y1 = conv_transpose1d(reshape(x, {g.n, g.cin, g.w}), reshape(w, {g.cin, g.cout / g.o.groups, g.kw}), b, o1);
      CHECK(y1.shape() == Shape{g.n, g.cout, ow});
      CHECK(std::memcmp(y1.data<float>(), y.data<float>(), y.numel() * 4) == 0);
    }
  }
}

TEST_CASE("unfold and fold are adjoint: <unfold(x), c> = <x, fold(c)>") {
  ConvOptions o = opts(2, 3, 1, 2, 2, 1, 1);
  Tensor x = randn({2, 3, 7, 8}, 7);
  Tensor cols = unfold(x, 3, 2, o);
  Tensor c = randn(cols.shape(), 8);
  Tensor back = fold(c, x.shape(), 3, 2, o);
  double lhs = 0, rhs = 0;
  for (int64_t i = 0; i < c.numel(); ++i) lhs += double(cols.data<float>()[i]) * c.data<float>()[i];
  for (int64_t i = 0; i < x.numel(); ++i) rhs += double(x.data<float>()[i]) * back.data<float>()[i];
  CHECK(lhs == doctest::Approx(rhs).epsilon(1e-6));
}

TEST_CASE("elu, leaky_relu and silu values") {
  // Their gradients (and the convolutions', weight_norm's, abs's) are
  // checked with every other op's in the op table (op_table.h).
  Tensor y = elu(from_vector({-1.f, 2.f}, {2}), 0.5f);
  CHECK(y.data<float>()[0] == doctest::Approx(0.5 * std::expm1(-1.0)));
  CHECK(y.data<float>()[1] == 2.f);
  CHECK(leaky_relu(from_vector({-2.f}, {1}), 0.1f).item<float>() == doctest::Approx(-0.2));
  CHECK(silu(from_vector({1.f}, {1})).item<float>() == doctest::Approx(1.0 / (1.0 + std::exp(-1.0))));
}

TEST_CASE("forward conv: a sample's output is the same bits alone and at any position of any batch") {
  // Every new forward op: the four convolutions (stride, padding, dilation,
  // weight normalization; groups on the 1-D ones, which run through the 2-D
  // code) and elu, leaky_relu, silu, abs.
  Generator gen(5, 0);
  Conv1d c1(3, 16, 7, gen, opts1(2, 3, 1, 1));
  Conv1d c1g(16, 16, 3, gen, opts1(1, 2, 2, 4), {true, true});
  ConvTranspose1d t1(16, 8, 8, gen, opts1(4, 2, 1, 1), {true, true});
  Conv2d c2(3, 8, 4, gen, opts(2, 2, 1, 1, 1, 1, 1), {true, true});
  ConvTranspose2d t2(3, 4, 4, gen, opts(2, 2, 1, 1, 1, 1, 1), {true, true});
  const int64_t total = 9;
  Tensor x1 = randn({total, 3, 40}, 30), x2 = randn({total, 3, 8, 8}, 31);
  auto run1 = [&](const Tensor& x) { return vqddp::abs(t1.forward(silu(elu(c1g.forward(leaky_relu(c1.forward(x))))))); };
  auto run2 = [&](const Tensor& x) { return concat({reshape(c2.forward(x), {x.size(0), -1}),
                                                    reshape(t2.forward(x), {x.size(0), -1})}, 1); };
  NoGradGuard no_grad;
  Tensor whole1 = run1(x1), whole2 = run2(x2);
  for (int64_t batch : {1, 2, 5, 9})
    for (int64_t at : {int64_t{0}, total - batch}) {
      CAPTURE(batch);
      CAPTURE(at);
      CHECK(same_bits(run1(slice_rows(x1, at, at + batch)), slice_rows(whole1, at, at + batch).clone()));
      CHECK(same_bits(run2(slice_rows(x2, at, at + batch)), slice_rows(whole2, at, at + batch).clone()));
    }
}

TEST_CASE("conv layers: weight normalization starts at the plain weight, names its parameters, and bad shapes throw") {
  Generator a(1, 0), b(1, 0);
  Conv1d plain(4, 6, 3, a, opts1(1, 1, 1, 2));
  Conv1d normed(4, 6, 3, b, opts1(1, 1, 1, 2), {true, true});
  auto names = normed.named_parameters();
  REQUIRE(names.size() == 3);
  CHECK(names[0].first == "weight_g");
  CHECK(names[1].first == "weight_v");
  CHECK(names[2].first == "bias");
  Tensor wp = plain.weight(), wn = normed.weight();
  for (int64_t i = 0; i < wp.numel(); ++i) CHECK(wn.data<float>()[i] == doctest::Approx(wp.data<float>()[i]));
  CHECK_THROWS_WITH(conv1d(randn({2, 3, 10}, 1), randn({6, 2, 3}, 2), Tensor(), opts1(1, 0, 1, 2)),
                    doctest::Contains("does not fit x"));
  CHECK_THROWS_WITH(conv1d(randn({2, 4, 2}, 1), randn({6, 4, 5}, 2), Tensor()), doctest::Contains("smaller than"));
  CHECK_THROWS_WITH(conv_transpose1d(randn({2, 4, 3}, 1), randn({4, 2, 3}, 2), Tensor(), opts1(2, 0, 1, 1, 2)),
                    doctest::Contains("output_padding 2 must be smaller than the stride 2"));
  Generator c(2, 0);
  CHECK_THROWS_WITH(Conv1d(4, 6, 3, c, opts1(1, 0, 1, 4)), doctest::Contains("divisible by groups 4"));
}

TEST_CASE("weight_norm: one op with the bits of square, sum, sqrt, div and mul, and its gradients' formula") {
  CHECK(weight_norm(zeros({0, 3}), zeros({0})).shape() == Shape{0, 3});  // no rows: nothing to divide by
  Tensor v = randn({5, 3, 7}, 3), g = randn({5}, 4);
  // The forward: the composite it replaced, op by op (float squares summed
  // in double, rounded, sqrt, g / |v|, times v).
  Tensor flat = reshape(v, {5, -1});
  Tensor composite = reshape(mul(flat, div(reshape(g, {5, 1}), sqrt(sum(square(flat), 1, true)))), v.shape());
  CHECK(same_bits(weight_norm(v, g), composite));
  // The backward: dg = <dw, v> / |v| and dv = (g / |v|) dw - (g <dw, v> / |v|^3) v per row, in double.
  Tensor dw = randn({5, 3, 7}, 5);
  Tensor vl = v.clone().set_requires_grad(true), gl = g.clone().set_requires_grad(true);
  sum(mul(weight_norm(vl, gl), dw)).backward();
  std::vector<float> hv = v.to_vector<float>(), hg = g.to_vector<float>(), hd = dw.to_vector<float>();
  std::vector<float> dv = vl.grad().to_vector<float>(), dg = gl.grad().to_vector<float>();
  for (int64_t r = 0; r < 5; ++r) {
    double ss = 0, dot = 0;
    for (int64_t j = 0; j < 21; ++j) {
      ss += double(hv[r * 21 + j]) * hv[r * 21 + j];
      dot += double(hd[r * 21 + j]) * hv[r * 21 + j];
    }
    const double n = std::sqrt(ss);
    CHECK(dg[r] == doctest::Approx(dot / n).epsilon(1e-5));
    for (int64_t j = 0; j < 21; ++j)
      CHECK(dv[r * 21 + j] ==
            doctest::Approx(hg[r] / n * hd[r * 21 + j] - hg[r] * dot / (n * n * n) * hv[r * 21 + j]).epsilon(1e-4));
  }
}

TEST_CASE("weight_norm on the CPU, rows side by side, gives each row the bits of the one-row formula a GPU thread runs") {
  // The CPU kernel takes a tensor's rows eight at a time (two groups here
  // and a tail of three); kernel_math.h's weight_norm_rows<1> is one GPU
  // thread's row. Both directions, bit for bit, at a few row lengths.
  for (int64_t cols : {1, 21, 64}) {
    CAPTURE(cols);
    const int64_t rows = 19;
    Tensor v = randn({rows, cols}, 11), g = randn({rows}, 12), dw = randn({rows, cols}, 13);
    Tensor vl = v.clone().set_requires_grad(true), gl = g.clone().set_requires_grad(true);
    Tensor w = weight_norm(vl, gl);
    sum(mul(w, dw)).backward();
    std::vector<float> hv = v.to_vector<float>(), hg = g.to_vector<float>(), hd = dw.to_vector<float>();
    std::vector<float> ew(hv.size()), edv(hv.size()), edg(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      weight_norm_rows<1>(&hv[r * cols], &hg[r], cols, &ew[r * cols]);
      weight_norm_rows_backward<1>(&hv[r * cols], &hg[r], &hd[r * cols], cols, &edv[r * cols], &edg[r]);
    }
    CHECK(std::memcmp(w.data<float>(), ew.data(), ew.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(vl.grad().data<float>(), edv.data(), edv.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(gl.grad().data<float>(), edg.data(), edg.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("col2im: the CPU's row loop gives the bits of the per-element formula the GPU runs") {
  // conv_plan.h: col2im_row (CPU) and col2im_value (one GPU thread per
  // element) must add the same taps in the same order.
  const ConvOptions geos[] = {opts(1, 1, 0, 0, 1, 1, 1), opts(2, 3, 1, 2, 1, 2, 1), opts(3, 2, 2, 0, 2, 3, 1),
                              opts(1, 5, 0, 3, 1, 1, 1)};
  for (const ConvOptions& o : geos) {
    Shape image{2, 3, 9, 13};
    ConvPlan p = plan_3x4(o, 13);
    Tensor cols = randn(Shape{p.rows(), p.col_width()}, 40);
    Tensor rows = fold(cols, image, 3, 4, o);  // the CPU kernel: col2im_row
    std::vector<float> each(static_cast<size_t>(shape_numel(image)));
    for (size_t e = 0; e < each.size(); ++e) each[e] = col2im_value(cols.data<float>(), p, static_cast<int64_t>(e));
    CHECK(std::memcmp(rows.data<float>(), each.data(), each.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("im2col: the CPU's row loop gives the entries of the per-tap formula the GPU runs") {
  // The CPU reads a row's taps without bounds checks where they all lie
  // inside the image; every entry must still be im2col_taps_at's.
  const ConvOptions geos[] = {opts(1, 1, 0, 3, 1, 1, 1), opts(2, 3, 1, 2, 1, 2, 1), opts(3, 2, 2, 0, 2, 3, 1),
                              opts(1, 5, 0, 0, 1, 1, 1), opts(1, 1, 0, 0, 1, 3, 1)};
  for (const ConvOptions& o : geos) {
    Shape image{2, 3, 9, 23};
    Tensor x = randn(image, 41);
    Tensor cols = unfold(x, 3, 4, o);  // the CPU kernel
    ConvPlan p = plan_3x4(o, 23);
    std::vector<float> each(static_cast<size_t>(p.rows() * p.col_width()));
    for (int64_t r = 0; r < p.rows(); ++r)
      for (int64_t ch = 0; ch < p.c; ++ch) im2col_taps(x.data<float>(), p, r, ch, each.data());
    CHECK(std::memcmp(cols.data<float>(), each.data(), each.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("conv_fixed and its gradients: the CPU's kernels give the bits of the per-element formulas the GPU runs") {
  // conv_plan.h: the GPU computes each element of a convolution, its input
  // gradient and its per-sample weight gradient where it is needed
  // (conv_output_value, conv_data_value, conv_weight_value); the CPU runs
  // its direct kernels (width stride 1) or im2col, fixed_gemm and col2im.
  // All must be the same chains. Padding
  // wide enough that whole taps fall outside, strides that skip inputs,
  // dilation, a bias and none; signed zeros in x reach the chains too.
  const ConvOptions geos[] = {opts(1, 1, 0, 0, 1, 1, 1), opts(2, 3, 1, 2, 1, 2, 1), opts(3, 2, 2, 0, 2, 3, 1),
                              opts(1, 5, 0, 3, 1, 1, 1), opts(2, 2, 3, 4, 1, 1, 1)};
  DeviceKernels& cpu = device_kernels(Device::cpu());
  auto bits = [](float v) { return std::bit_cast<uint32_t>(v); };
  int seed = 50;
  for (const ConvOptions& o : geos)
    for (bool with_bias : {true, false}) {
      ConvPlan p = plan_3x4(o, 13);
      const int64_t cout = 5, pos = p.oh * p.ow;
      Tensor x = randn(Shape{p.n, p.c, p.h, p.w}, seed++), w = randn(Shape{cout, p.col_width()}, seed++);
      Tensor g = randn(Shape{p.n, cout, pos}, seed++), bias = randn(Shape{cout}, seed++);
      Tensor bias_c = randn(Shape{p.c}, seed++);
      x.data<float>()[0] = -0.f, x.data<float>()[7] = 0.f;
      const float* b = with_bias ? bias.data<float>() : nullptr;
      const float* bc = with_bias ? bias_c.data<float>() : nullptr;
      std::vector<float> y(static_cast<size_t>(p.n * cout * pos)), dx(static_cast<size_t>(x.numel())),
          dw(static_cast<size_t>(p.n * cout * p.col_width()));
      cpu.conv_fixed(x.data<float>(), w.data<float>(), b, cout, y.data(), p);
      cpu.conv_fixed_data(g.data<float>(), w.data<float>(), bc, cout, dx.data(), p);
      std::vector<float> db(static_cast<size_t>(p.n * cout));
      cpu.conv_fixed_weight(x.data<float>(), g.data<float>(), cout, dw.data(), with_bias ? db.data() : nullptr, p);
      CAPTURE(with_bias);
      CAPTURE(o.stride[1]);
      for (size_t e = 0; e < y.size(); ++e)
        REQUIRE(bits(y[e]) == bits(conv_output_value(x.data<float>(), w.data<float>(), b, p, cout, int64_t(e))));
      for (size_t e = 0; e < dx.size(); ++e)
        REQUIRE(bits(dx[e]) == bits(conv_data_value(g.data<float>(), w.data<float>(), bc, p, cout, int64_t(e))));
      for (size_t e = 0; e < dw.size(); ++e)
        REQUIRE(bits(dw[e]) == bits(conv_weight_value(x.data<float>(), g.data<float>(), p, cout, int64_t(e))));
      // The bias partials: the engine's sum of each sample's g down to [C_out, 1, 1].
      if (with_bias)
        for (int64_t s = 0; s < p.n; ++s) {
          Tensor want = sum_to_shape(g.slice_rows(s, s + 1).reshape({1, cout, p.oh, p.ow}), {cout, 1, 1});
          for (int64_t c = 0; c < cout; ++c) {
            REQUIRE(bits(db[s * cout + c]) == bits(want.data<float>()[c]));
            REQUIRE(bits(db[s * cout + c]) == bits(conv_bias_value(g.data<float>(), p, s * cout + c)));
          }
        }
    }
}

TEST_CASE("weight_norm_all and WeightNormBatch: every layer's weight and gradients with weight_norm's bits, in one "
          "launch each way") {
  // A stack of weight-normalized convolutions, forward and backward with
  // each layer's own weight_norm and then inside a WeightNormBatch: the
  // same output and the same gradients bit for bit, and on sim one
  // weight-norm launch each way for the whole stack.
  for (Device dev : {Device::cpu(), Device::sim()}) {
    CAPTURE(dev.str());
    Generator gen(5, 0);
    Sequential net;
    net.add(std::make_shared<Conv1d>(3, 8, 3, gen, opts1(1, 1, 1, 1), ConvLayerOptions{true, true}))
        .add(std::make_shared<Conv1d>(8, 8, 4, gen, opts1(2, 1, 1, 1), ConvLayerOptions{true, true}))
        .add(std::make_shared<Conv1d>(8, 5, 1, gen, opts1(1, 0, 1, 1), ConvLayerOptions{false, true}))
        .add(std::make_shared<ConvTranspose1d>(5, 2, 4, gen, opts1(2, 1, 1, 1), ConvLayerOptions{true, false}));
    net.to(dev);
    Tensor x = randn({2, 3, 16}, 70).to(dev);
    auto run = [&](bool batched) {
      net.zero_grad();
      std::optional<WeightNormBatch> weights;
      if (batched) weights.emplace(net);
      Tensor y = net.forward(x);
      sum(mul(y, y)).backward();
      std::vector<Tensor> out{y.to(Device::cpu())};
      for (auto& [name, p] : net.named_parameters()) out.push_back(p.grad().to(Device::cpu()));
      return out;
    };
    auto launches_of = [](const LaunchRecording& r, std::string_view kernel) {
      return std::count_if(r.launches.begin(), r.launches.end(),
                           [&](const LaunchRecord& l) { return std::string_view(l.kernel) == kernel; });
    };
    std::vector<Tensor> each, once;
    {
      LaunchRecording r;
      each = run(false);
      if (dev == Device::sim()) CHECK(launches_of(r, "weight_norm") == 3);  // one per normalized layer
    }
    {
      LaunchRecording r;
      once = run(true);
      if (dev == Device::sim()) {
        CHECK(launches_of(r, "weight_norm") == 1);
        CHECK(launches_of(r, "weight_norm_backward") == 1);
      }
    }
    REQUIRE(each.size() == once.size());
    for (size_t i = 0; i < each.size(); ++i) CHECK(same_bits(each[i], once[i]));
  }
}

TEST_CASE("WeightNormBatch: batches nest and end in any order; each computes the weights afresh, and after the last "
          "the layer computes its own again") {
  // A stream keeps a batch for its life while forwards beside it make
  // their own (train/codec_stream.h): no batch may leave another's weight
  // behind, whichever ends first.
  Generator gen(6, 0);
  Conv1d layer(3, 4, 3, gen, opts1(1, 1, 1, 1), ConvLayerOptions{true, true});
  NamedTensors params = layer.named_parameters();
  Tensor g = params[0].second, v = params[1].second;  // weight_g, weight_v: the layer's own storage
  auto change_v = [&](float by) { v.data<float>()[0] += by; };
  auto fresh = [&] { return weight_norm(v.detach(), g.detach()); };
  NoGradGuard no_grad;
  auto outer = std::make_unique<WeightNormBatch>(layer);
  CHECK(same_bits(layer.weight(), fresh()));
  change_v(1.f);
  auto inner = std::make_unique<WeightNormBatch>(layer);
  CHECK(same_bits(layer.weight(), fresh()));  // the inner one computed them afresh
  outer.reset();                              // the outer ends first
  CHECK(same_bits(layer.weight(), fresh()));
  inner.reset();
  change_v(2.f);
  CHECK(same_bits(layer.weight(), fresh()));  // no batch's weight left behind
}

TEST_CASE("the CPU's conv kernels give the per-element formulas' bits on every path they take: forward, input "
          "gradient and per-example weight partials") {
  // The CPU's kernel table takes engine/cpu/fixed_conv.h's direct kernels
  // where they pay (direct_conv_paths); the column
  // path (im2col, the fixed GEMM, col2im) is what every other plan takes.
  // Each path against conv_plan.h's per-element formulas (what the GPU
  // runs). Padding and dilation on, several channels: a
  // 1-D plan, a 2-D plan with wide rows (the row kernels), one with narrow
  // rows and a kernel one column wide (the flattened planes), and one with
  // narrow rows and a wider kernel (the column path for the forward and
  // the input gradient, the direct weight kernel).
  DeviceKernels& k = device_kernels(Device::cpu());
  ConvPlan one_d;
  one_d.n = 3, one_d.c = 2, one_d.h = 1, one_d.w = 11, one_d.kh = 1, one_d.kw = 4, one_d.pw = 3, one_d.dw = 2;
  ConvPlan wide = one_d;
  wide.h = 9, wide.kh = 3, wide.sh = 2, wide.ph = 1, wide.dh = 2;
  ConvPlan flat = wide;
  flat.w = 3, flat.kw = 1, flat.pw = 0, flat.dw = 1;
  ConvPlan narrow = wide;
  narrow.w = 4, narrow.kw = 2, narrow.pw = 0, narrow.dw = 1;
  // Width strides (the row kernels read the input and write the input
  // gradient by phases): a codec's downsampling shape, a stride with
  // dilation, a stride wider than the kernel (phases with no tap, whose
  // input gradient is 0), and a 2-D plan with wide rows.
  ConvPlan strided = one_d;
  // 9 channels: more than one channel block of the input gradient on every ISA.
  strided.c = 9, strided.w = 23, strided.kw = 7, strided.sw = 3, strided.pw = 2, strided.dw = 1;
  ConvPlan strided_dilated = one_d;
  strided_dilated.w = 20, strided_dilated.sw = 2, strided_dilated.dw = 3;
  ConvPlan sparse = one_d;
  sparse.w = 26, sparse.kw = 3, sparse.sw = 4, sparse.pw = 1, sparse.dw = 1;
  ConvPlan wide_strided = wide;
  wide_strided.w = 30, wide_strided.kw = 5, wide_strided.sw = 2, wide_strided.pw = 2, wide_strided.dw = 1;
  // Pointwise (1x1, no padding: the residual units' convolutions), 1-D and
  // 2-D: the weight kernel reads x in place, with no padded copy.
  ConvPlan pointwise = one_d;
  pointwise.kw = 1, pointwise.pw = 0, pointwise.dw = 1;
  ConvPlan pointwise_2d = wide;
  pointwise_2d.kh = 1, pointwise_2d.sh = 1, pointwise_2d.ph = 0, pointwise_2d.dh = 1;
  pointwise_2d.kw = 1, pointwise_2d.pw = 0, pointwise_2d.dw = 1;
  for (ConvPlan p :
       {one_d, wide, flat, narrow, strided, strided_dilated, sparse, wide_strided, pointwise, pointwise_2d}) {
    CAPTURE(p.h);
    CAPTURE(p.w);
    CAPTURE(p.sw);
    p.oh = conv_output_size(p.h, p.kh, p.sh, p.ph, p.dh), p.ow = conv_output_size(p.w, p.kw, p.sw, p.pw, p.dw);
    // The table's half below runs the path named above: the direct kernels
    // for the first three plans, the weight's alone for the narrow one, the
    // column path for the small strided ones.
    const DirectConvPaths d = direct_conv_paths(p);
    const bool all_direct = p.sw == 1 && p.w != narrow.w;
    CHECK(d.forward == all_direct);
    CHECK(d.data == all_direct);
    CHECK(d.weight == (p.sw == 1));  // (the strided ones: under 15 positions or 8 channels)
    const int64_t cout = 5, pos = p.oh * p.ow, ck = p.col_width();
    Generator gen(9, 0);
    std::vector<float> x = rand_uniform({p.n, p.c, p.h, p.w}, gen, -1.f, 1.f).to_vector<float>(),
                       w = rand_uniform({cout, ck}, gen, -1.f, 1.f).to_vector<float>(),
                       g = rand_uniform({p.n, cout, pos}, gen, -1.f, 1.f).to_vector<float>();
    std::vector<float> y(static_cast<size_t>(p.n * cout * pos)), dx(x.size()), dw(static_cast<size_t>(p.n * cout * ck));
    // The table's choice, then every direct kernel itself.
    for (bool direct : {false, true}) {
      CAPTURE(direct);
      if (direct) {
        fixed_conv(p, x.data(), cout, w.data(), y.data());
        fixed_conv_data(p, cout, g.data(), w.data(), dx.data());
        fixed_conv_weight(p, x.data(), cout, g.data(), dw.data());
      } else {
        k.conv_fixed(x.data(), w.data(), nullptr, cout, y.data(), p);
        k.conv_fixed_data(g.data(), w.data(), nullptr, cout, dx.data(), p);
        k.conv_fixed_weight(x.data(), g.data(), cout, dw.data(), nullptr, p);
      }
      auto bits = [](float v) { return std::bit_cast<uint32_t>(v); };
      for (size_t e = 0; e < y.size(); ++e)
        REQUIRE(bits(y[e]) == bits(conv_output_value(x.data(), w.data(), nullptr, p, cout, int64_t(e))));
      for (size_t e = 0; e < dx.size(); ++e)
        REQUIRE(bits(dx[e]) == bits(conv_data_value(g.data(), w.data(), nullptr, p, cout, int64_t(e))));
      for (size_t e = 0; e < dw.size(); ++e)
        REQUIRE(bits(dw[e]) == bits(conv_weight_value(x.data(), g.data(), p, cout, int64_t(e))));
    }
  }  // The choice on the main job's width-strided plans (fixed_conv.h's
  // measurements): its 8 -> 64 stride-8 downsampling runs every direction
  // directly; its stride-5 one (40 positions) the weight gradient only; the
  // STFT's frames keep the column path, but for the longer frames' forward;
  // the large config's stride 4 at 10 positions keeps it too.
  auto plan_1d = [](int64_t c, int64_t w, int64_t k, int64_t s, int64_t pad) {
    ConvPlan q;
    q.n = 16, q.c = c, q.h = 1, q.w = w, q.kh = 1, q.kw = k, q.sw = s, q.pw = pad, q.oh = 1;
    q.ow = conv_output_size(w, k, s, pad, 1);
    return q;
  };
  auto paths = [](const ConvPlan& q) {
    const DirectConvPaths d = direct_conv_paths(q);
    return std::tuple(d.forward, d.data, d.weight);
  };
  CHECK(paths(plan_1d(8, 1600, 16, 8, 4)) == std::tuple(true, true, true));
  CHECK(paths(plan_1d(64, 200, 10, 5, 3)) == std::tuple(false, false, true));
  CHECK(paths(plan_1d(192, 40, 8, 4, 2)) == std::tuple(false, false, false));  // the large config's 10 positions
  CHECK(paths(plan_1d(1, 1600, 256, 64, 0)) == std::tuple(false, false, false));
  CHECK(paths(plan_1d(1, 1600, 128, 32, 0)) == std::tuple(true, false, false));
  CHECK(paths(plan_1d(64, 200, 3, 1, 1)) == std::tuple(true, true, true));
}
