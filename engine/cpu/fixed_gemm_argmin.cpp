#include "engine/cpu/fixed_gemm_argmin.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "engine/core/error.h"
#include "engine/cpu/gemm_isa.h"
#include "engine/cpu/parallel.h"

namespace vqddp {

namespace {

// Rows per fixed_gemm_argmin task.
constexpr int64_t kArgminRowsPerTask = 256;

}  // namespace

void fixed_gemm_argmin(int64_t n, int64_t d, int64_t k, const float* x, const float* embed, const float* bias,
                       float factor, int64_t* out) {
  VQDDP_CHECK(k > 0 && k < (int64_t{1} << 31), "fixed_gemm_argmin: {} table rows outside [1, 2^31)", k);
  if (n <= 0) return;
  const cpu::GemmIsa& kernels = cpu::active_isa();
  int64_t panels = (k + kernels.nr - 1) / kernels.nr;
  int64_t columns = panels * kernels.nr;
  // The table is packed once per call into the calling thread's
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
