// Our batch-invariant GEMM (engine/cpu/fixed_gemm.h) against OpenBLAS sgemm of
// the same shape, in the same process: the forward shapes of the default
// speech codec (a rank's 128 rows and the whole 512-row batch through the
// MLP encoder) and 16384x256 @ 256x1024, with 1 and 2 threads, and the GEMM
// floor `vqddp train --profile` measures (engine/gemm_floor.h).
// ratio = OpenBLAS time / our time (above 1: ours is faster).
#include <fmt/format.h>

#include <vector>

#include "bench/timing.h"
#include "engine/cpu/blas.h"
#include "engine/cpu/fixed_gemm.h"
#include "engine/gemm_floor.h"
#include "engine/cpu/parallel.h"
#include "engine/ops.h"
#include "engine/core/random.h"

using namespace vqddp;

namespace {

void run_shape(const char* what, int64_t m, int64_t n, int64_t k) {
  Generator g(1, 0);
  std::vector<float> a = rand_normal({m, k}, g).to_vector<float>(), w = rand_normal({n, k}, g).to_vector<float>();
  std::vector<float> c(m * n);
  // Linear's forward: x (m, k) @ W^T, W stored (n, k).
  int reps = m * n * k > (int64_t{1} << 28) ? 7 : 51;
  double blas = bench::median_ms([&] { blas_sgemm(false, true, m, n, k, 1.f, a.data(), k, w.data(), k, 0.f, c.data(), n); }, reps);
  double ours = bench::median_ms([&] { fixed_gemm(false, true, m, n, k, a.data(), k, w.data(), k, c.data(), n); }, reps);
  double flops = 2.0 * m * n * k;
  fmt::print("{:28} {:6d}x{:4d} @ {:4d}x{:4d}  OpenBLAS {:8.3f} ms ({:6.1f} GFLOP/s)  fixed {:8.3f} ms ({:6.1f} GFLOP/s)  ratio {:.2f}\n",
             what, m, k, k, n, blas, flops / blas / 1e6, ours, flops / ours / 1e6, blas / ours);
}

}  // namespace

int main(int, char** argv) {
  blas_prefer_fast_core(argv);
  for (int threads : {1, 2}) {
    cpu_set_threads(threads);
    fmt::print("OpenBLAS core {}, fixed_gemm {}, {} thread(s)\n", blas_core_name(), fixed_gemm_isa(), threads);
    run_shape("codec encoder in (rank)", 128, 256, 40);
    run_shape("codec encoder hidden (rank)", 128, 256, 256);
    run_shape("codec encoder out (rank)", 128, 16, 256);
    run_shape("codec encoder in (batch)", 512, 256, 40);
    run_shape("codec encoder hidden (batch)", 512, 256, 256);
    run_shape("codec decoder out (batch)", 512, 40, 256);
    run_shape("large", 16384, 1024, 256);
    // What `vqddp train --profile` measures its steps against (the faster of
    // the two on "large"), to give it with --gemm-floor.
    fmt::print("GEMM floor, {} thread(s): {:.1f} GFLOP/s\n", threads, measure_gemm_floor(Device::cpu()));
  }
  return 0;
}
