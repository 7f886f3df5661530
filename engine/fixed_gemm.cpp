#include "engine/fixed_gemm.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

#include "engine/conv_plan.h"
#include "engine/cpu/gemm_isa.h"
#include "engine/error.h"
#include "engine/parallel.h"

namespace vqddp {

namespace {

bool has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
}
bool has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
bool has_any() { return true; }

// The instruction sets, best first, each with its CPU test (run here, in a
// file compiled for the baseline instruction set).
struct IsaChoice {
  const cpu::GemmIsa* kernels;
  bool (*supported)();
};
const IsaChoice kIsas[] = {{&cpu::gemm_isa_avx512, has_avx512}, {&cpu::gemm_isa_avx2, has_avx2},
                           {&cpu::gemm_isa_scalar, has_any}};

const cpu::GemmIsa* find_isa(const std::string& name) {
  std::string known;
  for (const IsaChoice& c : kIsas) {
    if (name == c.kernels->name) {
      VQDDP_CHECK(c.supported(), "CPU instruction set '{}' requested, but this CPU does not have it", name);
      return c.kernels;
    }
    known += known.empty() ? c.kernels->name : std::string(", ") + c.kernels->name;
  }
  VQDDP_THROW("unknown CPU instruction set '{}' (expected one of {})", name, known);
}

const cpu::GemmIsa* default_isa() {
  if (const char* env = std::getenv("VQDDP_CPU_ISA"); env && *env) return find_isa(env);
  const IsaChoice* c = kIsas;
  while (!c->supported()) ++c;  // the last, scalar, runs anywhere
  return c->kernels;
}

std::atomic<const cpu::GemmIsa*>& chosen() {
  static std::atomic<const cpu::GemmIsa*> isa{default_isa()};
  return isa;
}

const cpu::GemmIsa& isa() { return *chosen().load(); }

// Rows per task below which a product is split over columns instead.
constexpr int64_t kMinRowsPerTask = 64;
// Multiply-adds per task below which waking another thread costs more
// than it saves (measured: bench/fixed_gemm, the codec's 128-row calls).
constexpr int64_t kMinFmasPerTask = int64_t{1} << 21;

// Rows per fixed_gemm_argmin task.
constexpr int64_t kArgminRowsPerTask = 256;

// Every set gives the same bits, so each call may take the fastest: the
// AVX-512 tile is 32 columns wide, and for 16 or fewer columns half of it
// would be padding; AVX2's 16-wide tile wastes none.
const cpu::GemmIsa& isa_for_columns(int64_t n) {
  const cpu::GemmIsa& chosen_isa = isa();
  if (n <= cpu::gemm_isa_avx2.nr && &chosen_isa == &cpu::gemm_isa_avx512) return cpu::gemm_isa_avx2;
  return chosen_isa;
}

}  // namespace

std::string fixed_gemm_isa() { return isa().name; }

void fixed_gemm_use_isa(const std::string& name) { chosen().store(name.empty() ? default_isa() : find_isa(name)); }

void fixed_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                int64_t ldb, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (int64_t i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, 0.f);
    return;
  }
  const cpu::GemmIsa& kernels = isa_for_columns(n);
  cpu::GemmArgs whole{ta, tb, m, n, k, a, lda, b, ldb, c, ldc};
  int64_t threads = cpu_threads();
  // One task per thread, each a contiguous share of whole register tiles:
  // rows when there are enough of them, else columns. Each task packs its
  // own operands, so the tasks share nothing but the inputs.
  bool by_rows = m >= threads * kMinRowsPerTask || n < threads * kernels.nr * 4;
  int64_t unit = by_rows ? kernels.mr : kernels.nr, extent = by_rows ? m : n;
  int64_t units = (extent + unit - 1) / unit;
  int64_t tasks = std::max<int64_t>(1, std::min({threads, units, m * n * k / kMinFmasPerTask}));
  parallel_for(tasks, [&](int64_t t) {
    int64_t lo = units * t / tasks * unit, hi = std::min(extent, units * (t + 1) / tasks * unit);
    if (lo >= hi) return;
    cpu::GemmArgs part = whole;
    if (by_rows) {
      part.m = hi - lo;
      part.a = ta ? a + lo : a + lo * lda;
      part.c = c + lo * ldc;
    } else {
      part.n = hi - lo;
      part.b = tb ? b + lo * ldb : b + lo;
      part.c = c + lo;
    }
    kernels.gemm(part);
  });
}

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

void cpu_unary(const UnaryFn& fn, const float* x, float* out, int64_t n) {
  isa().unary[static_cast<int>(fn.op)](fn, x, out, n);
}

void cpu_unary_backward(const UnaryFn& fn, const float* x, const float* y, const float* g, float* out, int64_t n) {
  isa().unary_backward[static_cast<int>(fn.op)](fn, x, y, g, out, n);
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

void fixed_gemm_reference(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                          const float* b, int64_t ldb, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.f;
      for (int64_t p = 0; p < k; ++p) acc = std::fma(ta ? a[p * lda + i] : a[i * lda + p], tb ? b[j * ldb + p] : b[p * ldb + j], acc);
      c[i * ldc + j] = acc;
    }
}

void fixed_gemm_argmin(int64_t n, int64_t d, int64_t k, const float* x, const float* embed, const float* bias,
                       float factor, int64_t* out) {
  VQDDP_CHECK(k > 0 && k < (int64_t{1} << 31), "fixed_gemm_argmin: codebook size {} outside [1, 2^31)", k);
  if (n <= 0) return;
  const cpu::GemmIsa& kernels = isa();
  int64_t panels = (k + kernels.nr - 1) / kernels.nr;
  int64_t columns = panels * kernels.nr;
  // The codebook is packed once per call into the calling thread's
  // grow-only buffers and shared by every task (read-only); the caller
  // waits for all of them. pack_codes writes every float, padding included.
  thread_local std::vector<float> packed_v, padded_v;
  float* packed = cpu::scratch(packed_v, columns * d);  // (panels, d, nr)
  float* padded = cpu::scratch(padded_v, columns);      // (panels * nr): bias, then NaN
  if (d > 0) kernels.pack_codes(embed, k, d, packed);
  std::copy_n(bias, k, padded);
  std::fill(padded + k, padded + columns, std::numeric_limits<float>::quiet_NaN());
  int64_t tasks = (n + kArgminRowsPerTask - 1) / kArgminRowsPerTask;
  parallel_for(tasks, [&](int64_t t) {
    int64_t lo = t * kArgminRowsPerTask, rows = std::min(kArgminRowsPerTask, n - lo);
    kernels.argmin({rows, d, panels, x + lo * d, packed, padded, factor, out + lo});
  });
}

}  // namespace vqddp
