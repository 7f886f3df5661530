// The batch-invariant forward (engine/cpu/fixed_gemm.h): every element is the
// one fma chain of the reference, so a row's bits never depend on the batch,
// its position, the split over ranks, the threads or the instruction set.
// tests/cpu_invariance.sh runs the same checks under every OpenBLAS core.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "engine/conv_plan.h"
#include "engine/cpu/fixed_gemm.h"
#include "engine/cpu/fixed_conv.h"
#include "engine/cpu/gemm_isa.h"
#include "engine/cpu/unary_loops.h"
#include "engine/cpu/fixed_gemm_argmin.h"
#include "engine/kernel_math.h"
#include "engine/nn.h"
#include "engine/ops.h"
#include "engine/cpu/parallel.h"
#include "engine/core/random.h"

using namespace vqddp;

namespace {

// The instruction sets this CPU can run; the default first.
std::vector<std::string> usable_isas() {
  std::vector<std::string> out{fixed_gemm_isa()};
  for (std::string name : {"avx512", "avx2", "scalar"}) {
    if (name == out[0]) continue;
    try {
      fixed_gemm_use_isa(name);
      out.push_back(name);
    } catch (const std::exception&) {
    }
  }
  fixed_gemm_use_isa("");
  return out;
}

std::vector<float> normal(int64_t n, uint64_t stream) {
  Generator g(5, stream);
  return rand_normal({n}, g).to_vector<float>();
}

// memcmp may not be given null, which an empty vector's data() can be.
bool same_bits(const float* a, const float* b, int64_t n) { return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0; }

// Restores the thread count and the instruction set at scope exit.
struct KernelSettings {
  int threads = cpu_threads();
  ~KernelSettings() {
    cpu_set_threads(threads);
    fixed_gemm_use_isa("");
  }
};

// body() under every usable instruction set with 1, 2 and 3 threads.
template <class F>
void on_every_isa_and_thread_count(F&& body) {
  for (const std::string& isa : usable_isas())
    for (int threads : {1, 2, 3}) {
      CAPTURE(isa);
      CAPTURE(threads);
      fixed_gemm_use_isa(isa);
      cpu_set_threads(threads);
      body();
    }
}

// Convolutions the direct kernels take (width stride 1), each with padding
// and dilation: 1-D ones (h = 1) with channel counts that are not a
// multiple of any tile height, outputs shorter and longer than a tile, a
// 1-tap kernel, one sample; 2-D ones with height strides 1 to 3, dilation
// along either axis, rows narrower and wider than a tile, a single output
// row and a single output channel, kernels one column wide (the flattened
// planes of fixed_conv.cpp at height strides 1, 2 and 3, and one too wide
// to flatten), and padding wider than the kernel reaches (1-D, flattened
// and flattened with a height stride), whose outputs lie beyond every read;
// and one of enough work that each kernel's phases split over 2 and 3
// threads, mid-sample (3 samples).
struct ConvCase {
  int64_t n, c, h, w, o, kh, kw, sh, ph, pw, dh, dw;
  ConvPlan plan() const {
    ConvPlan p;
    p.n = n, p.c = c, p.h = h, p.w = w, p.kh = kh, p.kw = kw, p.sh = sh, p.ph = ph, p.pw = pw, p.dh = dh, p.dw = dw;
    p.oh = conv_output_size(h, kh, sh, ph, dh), p.ow = conv_output_size(w, kw, 1, pw, dw);
    return p;
  }
};

const ConvCase kConvCases[] = {
    {2, 1, 1, 37, 8, 1, 7, 1, 0, 3, 1, 1},   {3, 8, 1, 50, 5, 1, 7, 1, 0, 3, 1, 1},  {1, 3, 1, 9, 13, 1, 3, 1, 0, 4, 1, 3},
    {2, 6, 1, 100, 4, 1, 1, 1, 0, 0, 1, 1},  {4, 5, 1, 40, 33, 1, 3, 1, 0, 1, 1, 2}, {1, 2, 1, 5, 1, 1, 5, 1, 0, 0, 1, 1},
    {2, 9, 1, 20, 3, 1, 4, 1, 0, 1, 1, 1},   {2, 2, 23, 13, 8, 9, 3, 1, 4, 1, 1, 1}, {3, 8, 21, 22, 9, 9, 3, 2, 4, 2, 1, 2},
    {1, 5, 17, 40, 7, 3, 3, 3, 1, 4, 2, 4},  {2, 3, 31, 2, 4, 5, 1, 3, 2, 0, 1, 1},  {2, 16, 9, 11, 16, 5, 1, 1, 2, 0, 1, 1},
    {1, 4, 3, 33, 1, 3, 3, 1, 0, 1, 1, 1},   {2, 7, 6, 19, 5, 2, 4, 2, 1, 3, 3, 1},  {1, 2, 20, 3, 5, 3, 1, 2, 2, 0, 2, 1},
    {1, 3, 12, 9, 4, 3, 1, 2, 1, 0, 1, 1},   {1, 1, 1, 120, 2, 1, 1, 1, 0, 40, 1, 1}, {1, 2, 5, 40, 3, 1, 1, 1, 1, 0, 1, 1},
    {2, 2, 7, 5, 3, 1, 1, 3, 3, 0, 1, 1},    {3, 8, 1, 400, 40, 1, 5, 1, 0, 2, 1, 1}};

// Poisoned scratch: each kernel test first runs the kernel on a NaN input
// on one thread, so its thread-local scratch (padded input, reshuffled
// rows, tiles) holds NaN wherever the plan's results go: a part the checked
// call then fails to compute is NaN, not the same plan's results left by
// the run before. (A weight gradient that skipped the last task of each
// thread's range passed without it.)
template <class F>
void on_one_thread(F&& body) {
  const int threads = cpu_threads();
  cpu_set_threads(1);
  body();
  cpu_set_threads(threads);
}

// Column entry ((s, oy, ox), (ch, ky, kx)) of the unfolded input: x under
// that tap, 0 in the padding.
float tap(const std::vector<float>& x, const ConvPlan& p, int64_t s, int64_t oy, int64_t ox, int64_t ch, int64_t ky,
          int64_t kx) {
  const int64_t iy = oy * p.sh - p.ph + ky * p.dh, ix = ox * p.sw - p.pw + kx * p.dw;
  return iy >= 0 && iy < p.h && ix >= 0 && ix < p.w ? x[((s * p.c + ch) * p.h + iy) * p.w + ix] : 0.f;
}

// unfold(x) [n oh ow, c kh kw], written out.
std::vector<float> unfold(const std::vector<float>& x, const ConvPlan& p) {
  std::vector<float> cols(p.rows() * p.col_width());
  for (int64_t s = 0; s < p.n; ++s)
    for (int64_t oy = 0; oy < p.oh; ++oy)
      for (int64_t ox = 0; ox < p.ow; ++ox)
        for (int64_t ch = 0; ch < p.c; ++ch)
          for (int64_t ky = 0; ky < p.kh; ++ky)
            for (int64_t kx = 0; kx < p.kw; ++kx)
              cols[((s * p.oh + oy) * p.ow + ox) * p.col_width() + (ch * p.kh + ky) * p.kw + kx] = tap(x, p, s, oy, ox, ch, ky, kx);
  return cols;
}

}  // namespace

TEST_CASE("fixed_gemm equals the one-chain reference bit for bit: every transpose mode, instruction set and thread count") {
  KernelSettings restore;
  // Shapes cross every block edge: k beyond one k block (256), n beyond one
  // column block (1536), m not a multiple of any tile height; m = 1 and n = 1.
  for (auto [m, n, k] : {std::array<int64_t, 3>{1, 1, 1}, {7, 33, 5}, {97, 1, 300}, {1, 1601, 40}, {131, 67, 513}, {200, 40, 256}})
    for (const std::string& isa : usable_isas())
      for (int threads : {1, 2, 3})
        for (int ta = 0; ta < 2; ++ta)
          for (int tb = 0; tb < 2; ++tb) {
            CAPTURE(m);
            CAPTURE(n);
            CAPTURE(k);
            CAPTURE(isa);
            CAPTURE(threads);
            CAPTURE(ta);
            CAPTURE(tb);
            fixed_gemm_use_isa(isa);
            cpu_set_threads(threads);
            std::vector<float> a = normal(m * k, 1), b = normal(k * n, 2), want(m * n), got(m * n, -1.f);
            int64_t lda = ta ? m : k, ldb = tb ? k : n;
            fixed_gemm_reference(ta, tb, m, n, k, a.data(), lda, b.data(), ldb, want.data(), n);
            fixed_gemm(ta, tb, m, n, k, a.data(), lda, b.data(), ldb, got.data(), n);
            CHECK(same_bits(got.data(), want.data(), m * n));
          }
}

TEST_CASE("fixed_conv gives the bits of the fixed_gemm chain on the im2col matrix: every ISA and thread count") {
  // The CPU's direct convolution (no im2col buffer) against the reference
  // chain on an explicit unfold of x.
  KernelSettings restore;
  for (const ConvCase& t : kConvCases) {
    const ConvPlan p = t.plan();
    CAPTURE(p.c);
    CAPTURE(p.h);
    CAPTURE(p.w);
    CAPTURE(t.o);
    CAPTURE(p.sh);
    const int64_t pos = p.oh * p.ow, ck = p.col_width();
    std::vector<float> x = normal(p.n * p.c * p.h * p.w, 3), w = normal(t.o * ck, 4);
    std::vector<float> cols = unfold(x, p), rows(p.rows() * t.o), want(p.n * t.o * pos);
    fixed_gemm_reference(false, true, p.rows(), t.o, ck, cols.data(), ck, w.data(), ck, rows.data(), t.o);
    for (int64_t s = 0; s < p.n; ++s)
      for (int64_t j = 0; j < t.o; ++j)
        for (int64_t i = 0; i < pos; ++i) want[(s * t.o + j) * pos + i] = rows[(s * pos + i) * t.o + j];
    const std::vector<float> nan_x(x.size(), NAN);
    on_every_isa_and_thread_count([&] {
      std::vector<float> got(want.size(), -1.f);
      on_one_thread([&] { fixed_conv(p, nan_x.data(), t.o, w.data(), got.data()); });  // NaN into its scratch (poisoned scratch, above)
      fixed_conv(p, x.data(), t.o, w.data(), got.data());
      CHECK(same_bits(got.data(), want.data(), static_cast<int64_t>(want.size())));
    });
  }
}

TEST_CASE("every instruction set's block transposition moves each float to its place and writes nothing else") {
  // The direct convolutions' reshuffles (fixed_conv_weight's g into rows
  // and its result back): 8 x 8 register blocks and the float-by-float
  // edges, at sizes on and off the blocks, with strides past the extents.
  KernelSettings restore;
  for (const std::string& isa : usable_isas()) {
    CAPTURE(isa);
    fixed_gemm_use_isa(isa);
    const cpu::GemmIsa& kernels = cpu::active_isa();
    for (int64_t rows : {1, 7, 8, 9, 16, 23})
      for (int64_t cols : {1, 5, 8, 15, 16, 17}) {
        CAPTURE(rows);
        CAPTURE(cols);
        const int64_t lda = cols + 3, ldb = rows + 2;
        const std::vector<float> a = normal(rows * lda, 9);
        std::vector<float> b(cols * ldb, -7.f);
        kernels.transpose(a.data(), lda, rows, cols, b.data(), ldb);
        bool placed = true, untouched = true;
        for (int64_t c = 0; c < cols; ++c)
          for (int64_t r = 0; r < ldb; ++r) {
            const float v = b[c * ldb + r];
            if (r < rows) placed &= std::memcmp(&v, &a[r * lda + c], sizeof v) == 0;
            else untouched &= v == -7.f;
          }
        CHECK(placed);
        CHECK(untouched);
      }
  }
}

TEST_CASE("fixed_conv_weight gives the bits of each sample's GEMM on the im2col matrix: every ISA and thread count") {
  // Sample s's weight gradient: the chain over its positions (oy, ox)
  // ascending of g times the im2col entry, as the column path's batched
  // GEMM computes it on unfold(x); output channel counts below and above a
  // tile's width.
  KernelSettings restore;
  for (const ConvCase& t : kConvCases) {
    const ConvPlan p = t.plan();
    CAPTURE(p.c);
    CAPTURE(p.h);
    CAPTURE(p.w);
    CAPTURE(t.o);
    CAPTURE(p.sh);
    const int64_t pos = p.oh * p.ow, ck = p.col_width();
    std::vector<float> x = normal(p.n * p.c * p.h * p.w, 5), g = normal(p.n * t.o * pos, 6), want(p.n * t.o * ck);
    const std::vector<float> cols = unfold(x, p);
    for (int64_t s = 0; s < p.n; ++s)
      fixed_gemm_reference(false, false, t.o, ck, pos, g.data() + s * t.o * pos, pos, cols.data() + s * pos * ck, ck,
                           want.data() + s * t.o * ck, ck);
    const std::vector<float> nan_x(x.size(), NAN);
    on_every_isa_and_thread_count([&] {
      std::vector<float> got(want.size(), -1.f);
      on_one_thread([&] { fixed_conv_weight(p, nan_x.data(), t.o, g.data(), got.data()); });  // NaN into its scratch (poisoned scratch, above)
      fixed_conv_weight(p, x.data(), t.o, g.data(), got.data());
      CHECK(same_bits(got.data(), want.data(), static_cast<int64_t>(want.size())));
    });
  }
}

TEST_CASE("fixed_conv_data gives the bits of fold on the fixed_gemm product of g's rows and the weight") {
  // The input gradient against what matmul's backward and col2im compute
  // in an exact step: each element the double sum of its valid taps
  // (ascending) of the chain over output channels.
  KernelSettings restore;
  for (const ConvCase& t : kConvCases) {
    const ConvPlan p = t.plan();
    CAPTURE(p.c);
    CAPTURE(p.h);
    CAPTURE(p.w);
    CAPTURE(t.o);
    CAPTURE(p.sh);
    const int64_t pos = p.oh * p.ow, ck = p.col_width();
    std::vector<float> g = normal(p.n * t.o * pos, 7), w = normal(t.o * ck, 8), want(p.n * p.c * p.h * p.w);
    for (int64_t s = 0; s < p.n; ++s)
      for (int64_t ch = 0; ch < p.c; ++ch)
        for (int64_t iy = 0; iy < p.h; ++iy)
          for (int64_t ix = 0; ix < p.w; ++ix) {
            double acc = 0.0;
            for (int64_t ky = 0; ky < p.kh; ++ky)
              for (int64_t kx = 0; kx < p.kw; ++kx) {
                const int64_t ty = iy + p.ph - ky * p.dh, ox = ix + p.pw - kx * p.dw;
                if (ty < 0 || ty % p.sh != 0 || ty / p.sh >= p.oh || ox < 0 || ox >= p.ow) continue;
                float chain = 0.f;
                for (int64_t j = 0; j < t.o; ++j)
                  chain = std::fma(g[(s * t.o + j) * pos + ty / p.sh * p.ow + ox], w[j * ck + (ch * p.kh + ky) * p.kw + kx], chain);
                acc += chain;
              }
            want[((s * p.c + ch) * p.h + iy) * p.w + ix] = static_cast<float>(acc);
          }
    const std::vector<float> nan_g(g.size(), NAN);
    on_every_isa_and_thread_count([&] {
      std::vector<float> got(want.size(), -1.f);
      on_one_thread([&] { fixed_conv_data(p, t.o, nan_g.data(), w.data(), got.data()); });  // NaN into its scratch (poisoned scratch, above)
      fixed_conv_data(p, t.o, g.data(), w.data(), got.data());
      CHECK(same_bits(got.data(), want.data(), static_cast<int64_t>(want.size())));
    });
  }
}

TEST_CASE("cpu_unary and cpu_unary_backward give the bits of every UnaryFn formula on every instruction set") {
  KernelSettings restore;
  std::vector<float> x = normal(4099, 9), y = normal(x.size(), 10), g = normal(x.size(), 11);
  for (float& v : x) v *= 8.f;  // well into both branches of each kink and the clamps' range
  for (float v : {0.f, -0.f, -18.5f, -100.f, 88.7f, 90.f, 1e-30f, -1e-30f, 1e-40f, std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), std::nanf("")})
    x.push_back(v), y.push_back(0.5f), g.push_back(1.f);
  const int64_t n = static_cast<int64_t>(x.size());
  for (int op = 0; op < UnaryFn::kOps; ++op) {
    const UnaryFn f{static_cast<UnaryFn::Op>(op), 0.3f, 0.9f};  // clamp's bounds, elu's alpha, leaky_relu's slope
    CAPTURE(op);
    std::vector<float> want(x.size()), want_grad(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      want[i] = f.f(x[i]);
      want_grad[i] = g[i] * f.df(x[i], y[i]);
    }
    for (const std::string& isa : usable_isas()) {
      CAPTURE(isa);
      fixed_gemm_use_isa(isa);
      std::vector<float> got(x.size(), -7.f), got_grad(x.size(), -7.f);
      cpu_unary(f, x.data(), got.data(), n);
      cpu_unary_backward(f, x.data(), y.data(), g.data(), got_grad.data(), n);
      CHECK(same_bits(got.data(), want.data(), n));
      CHECK(same_bits(got_grad.data(), want_grad.data(), n));
    }
  }
}

TEST_CASE("cpu_adamw gives the bits of adamw_update on every instruction set") {
  // Lengths off the vectors' widths, moments from zero (the first step)
  // and not, weight decay on, and the special values a step can meet.
  KernelSettings restore;
  AdamWStep s;
  s.lr = 2e-3f, s.beta1 = 0.8f, s.beta2 = 0.99f, s.eps = 1e-8f, s.weight_decay = 0.01f;
  s.c1 = 0.2f, s.sqrt_c2 = 0.1410674f;
  std::vector<float> p = normal(1037, 12), g = normal(p.size(), 13), m = normal(p.size(), 14), v = normal(p.size(), 15);
  for (size_t i = 0; i < v.size(); ++i) v[i] = i % 7 == 0 ? 0.f : v[i] * v[i] * 1e-3f;  // v >= 0, some exactly 0
  for (size_t i = 0; i < 40; ++i) m[i] = 0.f;
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {0.f, -0.f, 1e-40f, -1e-40f, 3e38f, inf, -inf, std::nanf("")})
    p.push_back(1.f), g.push_back(x), m.push_back(0.f), v.push_back(0.f);
  for (const std::string& isa : usable_isas()) {
    CAPTURE(isa);
    fixed_gemm_use_isa(isa);
    for (int64_t n : {int64_t{1}, int64_t{15}, int64_t{17}, static_cast<int64_t>(p.size())}) {
      CAPTURE(n);
      std::vector<float> want_p(p), want_m(m), want_v(v), got_p(p), got_m(m), got_v(v);
      for (int64_t i = 0; i < n; ++i) adamw_update(s, want_p[i], g[i], want_m[i], want_v[i]);
      cpu_adamw(s, got_p.data(), g.data(), got_m.data(), got_v.data(), n);
      CHECK(same_bits(got_p.data(), want_p.data(), static_cast<int64_t>(p.size())));
      CHECK(same_bits(got_m.data(), want_m.data(), static_cast<int64_t>(p.size())));
      CHECK(same_bits(got_v.data(), want_v.data(), static_cast<int64_t>(p.size())));
    }
  }
}

TEST_CASE("fixed_gemm keeps the sign of zero chains and propagates NaN like the reference") {
  // A chain whose every product underflows to a negative zero stays -0 (no
  // padding step may add +0), and a NaN in row 0 stays in row 0.
  KernelSettings restore;
  std::vector<float> a{-1e-30f, -1e-30f, 1.f, NAN}, b{1e-30f, 1e-30f};  // A (2, 2), B (2, 1)
  std::vector<float> got, want(2);
  fixed_gemm_reference(false, false, 2, 1, 2, a.data(), 2, b.data(), 1, want.data(), 1);
  CHECK(std::signbit(want[0]));
  for (const std::string& isa : usable_isas()) {
    CAPTURE(isa);
    fixed_gemm_use_isa(isa);
    got.assign(2, 7.f);
    fixed_gemm(false, false, 2, 1, 2, a.data(), 2, b.data(), 1, got.data(), 1);
    CHECK(std::signbit(got[0]));
    CHECK(got[0] == 0.f);
    CHECK(std::isnan(got[1]));
  }
}

TEST_CASE("fixed_gemm_argmin equals the argmin of fixed_gemm_reference scores on every ISA and thread count") {
  KernelSettings restore;
  // 700 rows: two full 256-row tasks and a partial one. 150 codes: many
  // panels on every set (32, 16 or 2 codes wide), the last one partial.
  // Codes 7, 71 and 130 are equal (lanes 7, 7 and 2 of a 32- or 16-code
  // panel, far apart in code order) and nearest to every third row, so
  // their equal scores must go to the lowest code (kernel_math.h,
  // nearest_better) however lanes, panels and tasks are merged. Code 40 holds
  // a NaN (its scores are NaN: never chosen), code 41's bias is +inf (never
  // chosen), and row 5 holds a NaN (no score is a number: code 0).
  const int64_t n = 700, d = 20, k = 150;
  const float factor = 2.f;
  std::vector<float> x = normal(n * d, 3), embed = normal(k * d, 4);  // (n, d), (k, d)
  for (int64_t j : {71, 130}) std::copy_n(embed.data() + 7 * d, d, embed.data() + j * d);
  embed[40 * d + 3] = NAN;
  for (int64_t i = 0; i < n; i += 3)
    for (int64_t p = 0; p < d; ++p) x[i * d + p] = embed[7 * d + p] + 0.01f * x[i * d + p];
  x[5 * d + 11] = NAN;
  std::vector<float> bias(k);  // |e_j|^2, as the Euclidean assignment passes it
  for (int64_t j = 0; j < k; ++j)
    for (int64_t p = 0; p < d; ++p) bias[j] += embed[j * d + p] * embed[j * d + p];
  bias[41] = INFINITY;

  std::vector<float> dots(n * k);  // (n, k)
  fixed_gemm_reference(false, true, n, k, d, x.data(), d, embed.data(), d, dots.data(), k);
  std::vector<int64_t> want(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t best_j = -1;
    float best = 0.f;
    for (int64_t j = 0; j < k; ++j) {
      float s = nearest_score(bias[j], factor, dots[i * k + j]);
      if (s < INFINITY && (best_j < 0 || s < best)) {  // NaN fails both comparisons
        best = s;
        best_j = j;
      }
    }
    want[i] = best_j < 0 ? 0 : best_j;
  }
  CHECK(std::count(want.begin(), want.end(), 7) >= n / 3);  // the tied rows
  CHECK(want[5] == 0);

  std::vector<int64_t> got;
  for (const std::string& isa : usable_isas())
    for (int threads : {1, 2, 3}) {
      CAPTURE(isa);
      CAPTURE(threads);
      fixed_gemm_use_isa(isa);
      cpu_set_threads(threads);
      got.assign(n, -7);
      fixed_gemm_argmin(n, d, k, x.data(), embed.data(), bias.data(), factor, got.data());
      CHECK(got == want);
    }
}

TEST_CASE("a row's forward matmul has the same bits in batches of 1 to 4099 rows, at any position, every transpose mode") {
  KernelSettings restore;
  const int64_t total = 4099, k = 40, n = 256;
  Generator g(3, 0);
  Tensor x = rand_normal({total, k}, g), w = rand_normal({n, k}, g);
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      CAPTURE(ta);
      CAPTURE(tb);
      Tensor xa = ta ? transpose(x, 0, 1) : x, wb = tb ? w : transpose(w, 0, 1);
      std::vector<float> whole = matmul(xa, wb, ta, tb).to_vector<float>();  // (total, n)
      for (int threads : {1, 2}) {
        cpu_set_threads(threads);
        for (int64_t batch : {1, 7, 511, 512, 513, 1500, 4099})
          for (int64_t at : {int64_t{0}, (total - batch) / 3, total - batch}) {
            CAPTURE(threads);
            CAPTURE(batch);
            CAPTURE(at);
            Tensor part = slice_rows(x, at, at + batch).clone();
            if (ta) part = transpose(part, 0, 1);
            std::vector<float> got = matmul(part, wb, ta, tb).to_vector<float>();
            CHECK(same_bits(got.data(), whole.data() + at * n, batch * n));
          }
      }
    }
}

TEST_CASE("an MLP encoder's output rows are the same bits on W = 1..8 ranks' uneven splits, empty ranks included") {
  // Linear -> gelu -> Linear -> tanh -> Linear: every forward op on the
  // codec's path to the quantizer.
  Generator g(9, 0);
  Sequential net;
  net.add(std::make_shared<Linear>(40, 96, g))
      .add(std::make_shared<Activation>([](const Tensor& t) { return gelu(t); }))
      .add(std::make_shared<Linear>(96, 64, g))
      .add(std::make_shared<Activation>([](const Tensor& t) { return vqddp::tanh(t); }))
      .add(std::make_shared<Linear>(64, 16, g));
  const int64_t total = 1500;
  Tensor x = rand_normal({total, 40}, g);
  std::vector<float> whole = net.forward(x).to_vector<float>();
  for (int world = 1; world <= 8; ++world) {
    // Rank r ends at total (r+1)^2 / W^2: shares grow with r; rank 1 takes none.
    std::vector<int64_t> ends;
    for (int r = 0; r < world; ++r) ends.push_back(total * (r + 1) * (r + 1) / (world * world));
    if (world > 1) ends[1] = ends[0];
    int64_t start = 0;
    for (int r = 0; r < world; ++r) {
      CAPTURE(world);
      CAPTURE(r);
      int64_t rows = ends[r] - start;
      std::vector<float> got = net.forward(slice_rows(x, start, ends[r]).clone()).to_vector<float>();
      REQUIRE(got.size() == static_cast<size_t>(rows * 16));
      CHECK(same_bits(got.data(), whole.data() + start * 16, rows * 16));
      start = ends[r];
    }
  }
}
