#include "engine/cpu/fixed_gemm.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>

#include "engine/core/error.h"
#include "engine/cpu/gemm_isa.h"
#include "engine/cpu/parallel.h"

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

}  // namespace

namespace cpu {

const GemmIsa& active_isa() { return *chosen().load(); }

// Every set gives the same bits, so each call may take the fastest: the
// AVX-512 tile is 32 columns wide, and for 16 or fewer columns half of it
// would be padding; AVX2's 16-wide tile wastes none.
const GemmIsa& isa_for_columns(int64_t n) {
  const GemmIsa& chosen_isa = active_isa();
  if (n <= gemm_isa_avx2.nr && &chosen_isa == &gemm_isa_avx512) return gemm_isa_avx2;
  return chosen_isa;
}


}  // namespace cpu

namespace {

// Rows per task below which a product is split over columns instead.
constexpr int64_t kMinRowsPerTask = 64;
// Multiply-adds per task below which waking another thread costs more
// than it saves (measured: bench/fixed_gemm, the codec's 128-row calls).
constexpr int64_t kMinFmasPerTask = int64_t{1} << 21;

}  // namespace

std::string fixed_gemm_isa() { return cpu::active_isa().name; }

void fixed_gemm_use_isa(const std::string& name) { chosen().store(name.empty() ? default_isa() : find_isa(name)); }

void fixed_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                int64_t ldb, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (int64_t i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, 0.f);
    return;
  }
  const cpu::GemmIsa& kernels = cpu::isa_for_columns(n);
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

void fixed_gemm_reference(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                          const float* b, int64_t ldb, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.f;
      for (int64_t p = 0; p < k; ++p) acc = std::fma(ta ? a[p * lda + i] : a[i * lda + p], tb ? b[j * ldb + p] : b[p * ldb + j], acc);
      c[i * ldc + j] = acc;
    }
}

}  // namespace vqddp
