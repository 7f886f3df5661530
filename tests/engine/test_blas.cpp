// The linked OpenBLAS is safe to call from several rank threads at once.
#include <doctest/doctest.h>

#include <thread>

#include "engine/blas.h"
#include "engine/parallel.h"
#include "engine/ops.h"
#include "engine/random.h"

using namespace vqddp;

TEST_CASE("concurrent sgemm from 4 threads with one BLAS thread each matches the serial results bitwise") {
  int saved = cpu_threads();
  cpu_set_threads(1);
  std::vector<Tensor> a, b, expect(4), got(4);
  for (int r = 0; r < 4; ++r) {
    Generator g(11, r);
    a.push_back(rand_normal({192, 96}, g));
    b.push_back(rand_normal({96, 160}, g));
    expect[r] = matmul(a[r], b[r]);
  }
  for (int round = 0; round < 5; ++round) {
    std::vector<std::thread> threads;
    for (int r = 0; r < 4; ++r) threads.emplace_back([&, r] { got[r] = matmul(a[r], b[r]); });
    for (auto& t : threads) t.join();
    for (int r = 0; r < 4; ++r) CHECK(got[r].to_vector<float>() == expect[r].to_vector<float>());
  }
  cpu_set_threads(saved);
  CHECK(cpu_threads() == saved);
  MESSAGE("OpenBLAS core: ", blas_core_name());
}
