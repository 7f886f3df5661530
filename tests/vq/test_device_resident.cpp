// Every quantizer's training step on the simulated device `sim`: the same
// bits as on the CPU (sim computes with the CPU's kernels, but through the
// device paths: staging, device constants, flags read late), and no
// device->host read or wait in a step once the quantizer is initialised
// (engine/device_counters.h). A step that adds one to_vector() or item()
// to its path fails here.
#include <doctest/doctest.h>

#include "tests/vq/quantizer_cases.h"

using namespace vqddp;
using namespace vqddp::test;

TEST_CASE("every quantizer: a training step on sim gives the CPU's bits, with W = 1 and W = 3 thread ranks") {
  for (const Case& c : quantizer_cases()) {
    CAPTURE(c.name);
    for (int w : {1, 3}) {
      CAPTURE(w);
      std::vector<RankRun> cpu = run_case(c, Device::cpu(), w, 4), sim = run_case(c, Device::sim(), w, 4);
      for (int r = 0; r < w; ++r) {
        CAPTURE(r);
        CHECK(first_difference(sim[r].state, cpu[r].state) == "");
        REQUIRE(sim[r].last_outputs.size() == cpu[r].last_outputs.size());
        for (size_t i = 0; i < cpu[r].last_outputs.size(); ++i)
          CHECK(first_difference({{"out", sim[r].last_outputs[i]}}, {{"out", cpu[r].last_outputs[i]}}) == "");
      }
    }
  }
}

TEST_CASE("every quantizer: once initialised, a training step on sim reads nothing back and never waits") {
  for (const Case& c : quantizer_cases()) {
    CAPTURE(c.name);
    for (int w : {1, 3}) {
      CAPTURE(w);
      std::vector<RankRun> sim = run_case(c, Device::sim(), w, 4);
      for (int r = 0; r < w; ++r)
        for (size_t s = 1; s < sim[r].counts.size(); ++s) {  // step 0 may run k-means init (one documented read)
          CAPTURE(r);
          CAPTURE(s);
          const DeviceCounters& got = sim[r].counts[s];
          CAPTURE(got.str());
          CHECK((got.to_host == 0) != c.reads_back);
          CHECK((got.waits == 0) != c.reads_back);
        }
    }
  }
}
