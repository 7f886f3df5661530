// Timing helper shared by the benchmarks: the median of several runs.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace vqddp::bench {

// The median of timings taken elsewhere (e.g. on one rank of several).
inline double median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Runs f `reps` times and returns the median wall time in milliseconds.
template <class F>
double median_ms(F f, int reps) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto s = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s).count());
  }
  return median(t);
}

}  // namespace vqddp::bench
