// Forward + backward of the modules users build codecs from, single rank:
// ResidualVQ with 8 layers, K = 1024, D = 256, N = 16384, and FSQ [8,5,5,5]
// at N = 65536. Baseline in the same run: one sgemm of the ResidualVQ's
// per-layer distance shape (N x D . D x K), so the ratio says how many
// "distance GEMMs" a whole 8-layer step costs.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "bench/timing.h"
#include "comm/single.h"
#include "engine/cpu/blas.h"
#include "engine/cpu/parallel.h"
#include "engine/ops.h"
#include "vq/fsq.h"
#include "vq/residual_vq.h"

using namespace vqddp;


int main(int, char** argv) {
  blas_prefer_fast_core(argv);
  fmt::print("single rank, OpenBLAS core {}, {} BLAS threads\n", blas_core_name(), cpu_threads());
  const int64_t n = 16384, d = 256, k = 1024;
  Generator g(1, 0);
  Tensor x = rand_normal({n, d}, g);
  Tensor e = rand_normal({k, d}, g);
  std::vector<float> scores(n * k);
  double gemm = vqddp::bench::median_ms([&] { blas_sgemm(false, true, n, k, d, 1.f, x.data<float>(), d, e.data<float>(), d, 0.f,
                                           scores.data(), k); }, 3);

  ResidualVQOptions o;
  o.dim = d;
  o.num_quantizers = 8;
  o.codebook_size = k;
  o.codebook.kmeans_init = false;  // steady-state steps
  Generator init(0, 0);
  ResidualVQ rvq(o, init);
  SingleCommunicator comm;
  Tensor xr = x.clone();
  xr.set_requires_grad(true);
  double rvq_ms = vqddp::bench::median_ms([&] {
    QuantizerOutput out = rvq.quantize(xr, comm);
    add(mean(square(out.quantized)), out.loss).backward();
    xr.zero_grad();
  }, 3);
  fmt::print("ResidualVQ Q=8 K={} D={} N={}: forward+backward {:.1f} ms ({:.2f}x one {:.1f} ms distance sgemm)\n", k, d,
             n, rvq_ms, rvq_ms / gemm, gemm);

  FSQ fsq({{8, 5, 5, 5}}, init);
  Tensor z = rand_normal({65536, 4}, g);
  z.set_requires_grad(true);
  double fsq_ms = vqddp::bench::median_ms([&] {
    QuantizerOutput out = fsq.quantize(z, comm);
    mean(square(out.quantized)).backward();
    z.zero_grad();
  }, 5);
  fmt::print("FSQ [8,5,5,5] N=65536: forward+backward {:.1f} ms ({:.1f} ns per row)\n", fsq_ms, fsq_ms * 1e6 / 65536);
  return 0;
}
