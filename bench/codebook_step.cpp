// One EMA codebook: training step and eval step, single rank, against a
// plain OpenBLAS sgemm of the same N x D . D x K shape in the same run.
//
// Not a test: it prints milliseconds per step, the ratio step / sgemm, and
// the process's peak resident memory growth during the steps (the blocked
// assignment never holds the N x K score matrix).
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "bench/timing.h"
#include "comm/single.h"
#include "engine/cpu/blas.h"
#include "engine/cpu/fixed_gemm.h"
#include "engine/cpu/parallel.h"
#include "engine/ops.h"
#include "vq/codebook.h"

using namespace vqddp;

namespace {

long peak_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

void run_sizes(int64_t n, int64_t d, int64_t k) {
  Generator g(1, 0);
  Tensor x = rand_normal({n, d}, g);  // (N, D)
  Tensor e = rand_normal({k, d}, g);  // (K, D)
  std::vector<float> scores(n * k);   // the baseline does materialise N x K
  double gemm = vqddp::bench::median_ms([&] { blas_sgemm(false, true, n, k, d, 1.f, x.data<float>(), d, e.data<float>(), d, 0.f,
                                         scores.data(), k); }, 5);
  scores = std::vector<float>();
  scores.shrink_to_fit();

  CodebookOptions o;
  o.codebook_size = k;
  o.dim = d;
  o.kmeans_init = false;  // time the steady-state step, not the one-off init
  Generator init(0, 0);
  Codebook book(o, init);
  book.embed.copy_(e);
  book.embed_avg.copy_(e);
  SingleCommunicator comm;
  long rss0 = peak_rss_kib();
  double train = vqddp::bench::median_ms([&] { book.forward(x, comm); }, 5);
  book.eval();
  double eval = vqddp::bench::median_ms([&] { book.forward(x, comm); }, 5);
  long grew = peak_rss_kib() - rss0;
  double flops = 2.0 * n * d * k;
  fmt::print("N={:6d} D={:4d} K={:5d}  sgemm {:7.2f} ms ({:5.1f} GFLOP/s) | train step {:7.2f} ms ({:.2f}x sgemm) | "
             "eval step {:7.2f} ms ({:.2f}x sgemm) | peak RSS growth {:.1f} MiB (N x K would be {:.0f} MiB)\n",
             n, d, k, gemm, flops / gemm / 1e6, train, train / gemm, eval, eval / gemm, grew / 1024.0,
             n * k * 4.0 / (1 << 20));
}

}  // namespace

int main(int, char** argv) {
  blas_prefer_fast_core(argv);
  for (int threads : {1, 2}) {
    cpu_set_threads(threads);
    fmt::print("single rank, OpenBLAS core {}, fixed_gemm {}, {} thread(s)\n", blas_core_name(), fixed_gemm_isa(), threads);
    run_sizes(16384, 256, 1024);
    run_sizes(65536, 64, 4096);
  }
  return 0;
}
