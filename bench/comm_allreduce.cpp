// Thread-backend all_reduce: bandwidth against memcpy, and latency.
//
// Prints (a) the effective bandwidth of a 64 MiB float32 all_reduce(sum)
// across 4 rank threads (bytes per rank / time per call) as a ratio to a
// plain memcpy of the same 64 MiB in the same process, and (b) the latency
// of a 1-element all_reduce across 4 ranks. Not a test: numbers only.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "bench/timing.h"
#include "comm/thread_group.h"
#include "engine/blas.h"

using namespace vqddp;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

int main(int, char** argv) {
  blas_prefer_fast_core(argv);
  constexpr int kWorld = 4, kReps = 7;
  constexpr int64_t kFloats = 64 * 1024 * 1024 / 4;
  constexpr double kBytes = kFloats * 4.0;

  std::vector<float> src(kFloats, 1.f), dst(kFloats);
  std::memcpy(dst.data(), src.data(), kBytes);  // fault the pages in
  std::vector<double> copy_times;
  for (int i = 0; i < kReps; ++i) {
    auto t = Clock::now();
    std::memcpy(dst.data(), src.data(), kBytes);
    copy_times.push_back(seconds_since(t));
  }
  double copy_bw = kBytes / bench::median(copy_times);

  std::vector<double> reduce_times;
  double per_call_latency = 0;
  run_ranks(kWorld, [&](Communicator& comm) {
    Tensor t = full({kFloats}, 1.0);
    comm.all_reduce(t, ReduceOp::sum);  // warm-up
    for (int i = 0; i < kReps; ++i) {
      comm.barrier();
      auto start = Clock::now();
      comm.all_reduce(t, ReduceOp::sum);
      if (comm.rank() == 0) reduce_times.push_back(seconds_since(start));
    }
    Tensor one = zeros({1});
    constexpr int kCalls = 2000;
    for (int i = 0; i < 100; ++i) comm.all_reduce(one, ReduceOp::sum);
    comm.barrier();
    auto start = Clock::now();
    for (int i = 0; i < kCalls; ++i) comm.all_reduce(one, ReduceOp::sum);
    if (comm.rank() == 0) per_call_latency = seconds_since(start) / kCalls;
  });
  double reduce_bw = kBytes / bench::median(reduce_times);

  fmt::print("thread backend, {} ranks on {} cores\n", kWorld, std::thread::hardware_concurrency());
  fmt::print("memcpy 64 MiB:               {:8.2f} ms  {:6.2f} GB/s\n", kBytes / copy_bw * 1e3, copy_bw / 1e9);
  fmt::print("all_reduce(sum) 64 MiB x {}:  {:8.2f} ms  {:6.2f} GB/s effective (bytes per rank / time)\n", kWorld,
             kBytes / reduce_bw * 1e3, reduce_bw / 1e9);
  fmt::print("ratio all_reduce / memcpy bandwidth: {:.3f}\n", reduce_bw / copy_bw);
  fmt::print("all_reduce(sum) of 1 float x {}: {:.2f} us per call\n", kWorld, per_call_latency * 1e6);
  return 0;
}
