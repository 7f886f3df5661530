#include "engine/cpu/blas.h"

#include <cblas.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "engine/core/error.h"

// OpenBLAS extensions; declared in its cblas.h too, repeated here so the
// file states exactly what it relies on.
extern "C" {
char* openblas_get_corename(void);
void openblas_set_num_threads(int);
int openblas_get_num_threads(void);
}

namespace vqddp {

void blas_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  VQDDP_CHECK(m < (int64_t{1} << 31) && n < (int64_t{1} << 31) && k < (int64_t{1} << 31),
              "sgemm dimensions {}x{}x{} exceed the 32-bit BLAS interface", m, n, k);
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

void blas_set_threads(int n) { openblas_set_num_threads(n < 1 ? 1 : n); }
int blas_threads() { return openblas_get_num_threads(); }
std::string blas_core_name() { return openblas_get_corename(); }

void blas_prefer_fast_core(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") || std::getenv("VQDDP_NO_REEXEC")) return;
  std::string core = blas_core_name();
  // Cores OpenBLAS falls back to when it does not recognise the CPU.
  static const char* kGeneric[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Sandybridge",
                                   "Barcelona", "Unknown", "generic"};
  bool generic = false;
  for (const char* g : kGeneric) generic |= core == g;
  if (!generic) return;
  __builtin_cpu_init();
  const char* fast = __builtin_cpu_supports("avx512f") ? "SkylakeX" : __builtin_cpu_supports("avx2") ? "Haswell" : nullptr;
  if (!fast) return;
  setenv("OPENBLAS_CORETYPE", fast, 1);
  setenv("VQDDP_NO_REEXEC", "1", 1);  // never loop, whatever the library does
  execv("/proc/self/exe", argv);
  // exec failed (e.g. no /proc): carry on with the slow core.
}

}  // namespace vqddp
