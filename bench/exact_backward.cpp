// The weight-gradient products of the main job (examples/speech_codec.json,
// batch 16 on 4 ranks: 4 examples per rank) as training computed them
// before exact data parallelism (OpenBLAS sgemm over a rank's rows, then a
// float32 sum over the ranks in rank order) and as an exact step computes
// them (engine/exact_batch.h: one fixed-order chain per example, the
// examples' partials added in order in double): time per rank, and the
// largest error of each against a float64 reference on the same inputs.
// usage: bench_exact_backward [reps]
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <vector>

#include "bench/timing.h"
#include "engine/cpu/blas.h"
#include "engine/cpu/fixed_gemm.h"
#include "engine/core/random.h"
#include "engine/core/tensor.h"

using namespace vqddp;

namespace {

struct Shape3 {
  const char* layer;
  int64_t m, n, rows;  // dW [m, n] = dY^T [m, rows] cols [rows, n], rows per example
};

// Every weight of the conv codec: C_out x (C_in * K) and the positions per example.
const Shape3 kLayers[] = {
    {"enc.0 conv 1->8 k7", 8, 7, 1600},       {"enc.1 res 8 k3", 8, 24, 1600},
    {"enc.3 conv 8->64 k16 s8", 64, 128, 200}, {"enc.4 res 64 k3", 64, 192, 200},
    {"enc.6 conv 64->128 k10 s5", 128, 640, 40}, {"enc.8 conv 128->16 k3", 16, 384, 40},
    {"dec.0 conv 16->128 k7", 128, 112, 40},   {"dec.2 up 128->64 k10", 128, 640, 40},
    {"dec.3 res 64 k3", 64, 192, 200},         {"dec.5 up 64->8 k16", 64, 128, 200},
    {"dec.8 conv 8->1 k7", 1, 56, 1600},
};
constexpr int kRanks = 4, kPerRank = 4;

}  // namespace

int main(int argc, char** argv) {
  int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  Generator gen(1, 0);
  fmt::print("{:<28} {:>10} {:>10} {:>7} {:>12} {:>12}\n", "layer (per rank: 4 examples)", "sgemm ms", "exact ms",
             "ratio", "err before", "err exact");
  double total_blas = 0, total_exact = 0, worst_before = 0, worst_exact = 0;
  for (const Shape3& s : kLayers) {
    const int64_t examples = kRanks * kPerRank, rows = examples * s.rows;
    Tensor dy = rand_normal({rows, s.m}, gen), cols = rand_normal({rows, s.n}, gen);
    const float *pg = dy.data<float>(), *pc = cols.data<float>();
    // Reference: every product and sum in double.
    std::vector<double> ref(s.m * s.n, 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < s.m; ++i)
        for (int64_t j = 0; j < s.n; ++j) ref[i * s.n + j] += double(pg[r * s.m + i]) * pc[r * s.n + j];
    // Before: each rank's sgemm, then float32 sums in rank order.
    std::vector<float> before(s.m * s.n, 0.f), part(s.m * s.n);
    for (int q = 0; q < kRanks; ++q) {
      int64_t lo = q * kPerRank * s.rows;
      blas_sgemm(true, false, s.m, s.n, kPerRank * s.rows, 1.f, pg + lo * s.m, s.m, pc + lo * s.n, s.n, 0.f,
                 part.data(), s.n);
      for (size_t e = 0; e < part.size(); ++e) before[e] += part[e];
    }
    // Exact: one fixed-order chain per example, added in order in double.
    std::vector<float> units(examples * s.m * s.n), exact(s.m * s.n);
    for (int64_t u = 0; u < examples; ++u)
      fixed_gemm(true, false, s.m, s.n, s.rows, pg + u * s.rows * s.m, s.m, pc + u * s.rows * s.n, s.n,
                 units.data() + u * s.m * s.n, s.n);
    for (size_t e = 0; e < exact.size(); ++e) {
      double acc = 0;
      for (int64_t u = 0; u < examples; ++u) acc += units[u * s.m * s.n + e];
      exact[e] = static_cast<float>(acc);
    }
    // Errors relative to the tensor's largest value.
    double scale = 0, eb = 0, ee = 0;
    for (double v : ref) scale = std::max(scale, std::abs(v));
    for (size_t e = 0; e < ref.size(); ++e) {
      eb = std::max(eb, std::abs(before[e] - ref[e]) / scale);
      ee = std::max(ee, std::abs(exact[e] - ref[e]) / scale);
    }
    // Time on one rank's share: its sgemm vs its examples' chains.
    double t_blas = bench::median_ms([&] {
      blas_sgemm(true, false, s.m, s.n, kPerRank * s.rows, 1.f, pg, s.m, pc, s.n, 0.f, part.data(), s.n);
    }, reps);
    double t_exact = bench::median_ms([&] {
      for (int64_t u = 0; u < kPerRank; ++u)
        fixed_gemm(true, false, s.m, s.n, s.rows, pg + u * s.rows * s.m, s.m, pc + u * s.rows * s.n, s.n,
                   units.data() + u * s.m * s.n, s.n);
    }, reps);
    total_blas += t_blas;
    total_exact += t_exact;
    worst_before = std::max(worst_before, eb);
    worst_exact = std::max(worst_exact, ee);
    fmt::print("{:<28} {:>10.4f} {:>10.4f} {:>7.2f} {:>12.2e} {:>12.2e}\n", s.layer, t_blas, t_exact, t_exact / t_blas,
               eb, ee);
  }
  fmt::print("{:<28} {:>10.4f} {:>10.4f} {:>7.2f} {:>12.2e} {:>12.2e}\n", "all weight gradients", total_blas,
             total_exact, total_exact / total_blas, worst_before, worst_exact);
  fmt::print("(errors: max |x - float64 reference| / max |reference|, over the global batch of 16; fixed_gemm ISA {})\n",
             fixed_gemm_isa());
  return 0;
}
