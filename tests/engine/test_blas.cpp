// The CPU products rank threads call at once: OpenBLAS (backward passes,
// one BLAS thread per rank) and our fixed-order GEMM (forward passes, whose
// shared pool a second caller finds busy and then computes alone).
#include <doctest/doctest.h>

#include <functional>
#include <thread>

#include "engine/cpu/blas.h"
#include "engine/cpu/fixed_gemm.h"
#include "engine/cpu/parallel.h"
#include "engine/ops.h"
#include "engine/core/random.h"

using namespace vqddp;

namespace {

using Gemm = std::function<void(const float* a, const float* b, float* c)>;  // (256, 128) @ (128, 256): 8.4M multiply-adds, enough for fixed_gemm to use 2 tasks

// Four threads, five rounds, each thread its own operands: every result
// must be bitwise the one a lone call computed, with `threads` CPU threads.
void check_concurrent_calls(int threads, const Gemm& gemm) {
  int saved = cpu_threads();
  cpu_set_threads(threads);
  std::vector<std::vector<float>> a, b, expect(4), got(4, std::vector<float>(256 * 256));
  for (int r = 0; r < 4; ++r) {
    Generator g(11, r);
    a.push_back(rand_normal({256, 128}, g).to_vector<float>());
    b.push_back(rand_normal({128, 256}, g).to_vector<float>());
    expect[r].resize(256 * 256);
    gemm(a[r].data(), b[r].data(), expect[r].data());
  }
  for (int round = 0; round < 5; ++round) {
    std::vector<std::thread> workers;
    for (int r = 0; r < 4; ++r) workers.emplace_back([&, r] { gemm(a[r].data(), b[r].data(), got[r].data()); });
    for (auto& t : workers) t.join();
    for (int r = 0; r < 4; ++r) CHECK(got[r] == expect[r]);
  }
  cpu_set_threads(saved);
}

}  // namespace

TEST_CASE("concurrent sgemm from 4 threads with one BLAS thread each matches the serial results bitwise") {
  check_concurrent_calls(1, [](const float* a, const float* b, float* c) {
    blas_sgemm(false, false, 256, 256, 128, 1.f, a, 128, b, 256, 0.f, c, 256);
  });
  MESSAGE("OpenBLAS core: ", blas_core_name());
}

TEST_CASE("concurrent fixed_gemm from 4 threads sharing a 2-thread pool matches the serial results bitwise") {
  check_concurrent_calls(2, [](const float* a, const float* b, float* c) {
    fixed_gemm(false, false, 256, 256, 128, a, 128, b, 256, c, 256);
  });
}
