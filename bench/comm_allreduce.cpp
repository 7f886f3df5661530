// all_reduce of the host backends: bandwidth against memcpy, and latency.
//
//   build/bench/bench_comm_allreduce [--backend thread] [--world W]  W (4) rank threads
//   mpirun -np 4 build/bench/bench_comm_allreduce --backend mpi   4 processes
//
// Prints (a) the effective bandwidth of a 64 MiB float32 all_reduce(sum)
// across W ranks (bytes per rank / time per call) as a ratio to a plain
// memcpy of the same 64 MiB in the same process, and (b) the latency of a
// 1-element all_reduce across W ranks, also as a ratio to a memcpy of its 4
// bytes. Both backends reduce in ascending rank order (comm/rank_order.h).
// With --backend mpi it also times MPI's own MPI_Allreduce (any order, no
// deadline) on the same buffers: what the rank order and the polling cost.
// Not a test: numbers only.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "bench/timing.h"
#include "comm/backends.h"
#include "engine/cpu/blas.h"
#include "vqddp_config.h"
#if VQDDP_HAVE_MPI
#include <mpi.h>
#endif

using namespace vqddp;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

int main(int argc, char** argv) {
  blas_prefer_fast_core(argv);
  std::string backend = "thread";
  int ranks = 4;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--backend") == 0) backend = argv[i + 1];
    if (std::strcmp(argv[i], "--world") == 0) ranks = std::atoi(argv[i + 1]);
  }
  constexpr int kReps = 7, kCalls = 20000;
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
  // A 4-byte memcpy, through a volatile pointer so it is not folded away.
  float one_src = 1.f, one_dst = 0.f;
  void* (*volatile copy)(void*, const void*, size_t) = std::memcpy;
  auto t0 = Clock::now();
  for (int i = 0; i < kCalls * 100; ++i) copy(&one_dst, &one_src, sizeof one_src);
  double copy_one = seconds_since(t0) / (kCalls * 100);

  // The main job's gradient reduction per step (235,626 parameters, batch 16
  // on the W ranks): before exact data parallelism one all_reduce of the
  // gradient; now reduce_units of one partial per example (unit).
  constexpr int64_t kParams = 235626, kUnits = 16;
  std::vector<double> grad_before, grad_exact;
  std::vector<double> reduce_times, native_times;
  double per_call_latency = 0, native_latency = 0;
  int world = 0, lead = 0;
  launch_ranks({.backend = backend, .world_size = ranks}, [&](Communicator& comm) {
    Tensor t = full({kFloats}, 1.0);
    comm.all_reduce(t, ReduceOp::sum);  // warm-up
    for (int i = 0; i < kReps; ++i) {
      comm.barrier();
      auto start = Clock::now();
      comm.all_reduce(t, ReduceOp::sum);
      if (comm.rank() == 0) reduce_times.push_back(seconds_since(start));
    }
    std::vector<int64_t> units;
    for (int r = 0, w = comm.world_size(); r < w; ++r) units.push_back(kUnits * (r + 1) / w - kUnits * r / w);
    Tensor grad = full({kParams}, 1.0), partials = full({units[comm.rank()], kParams}, 1.0), sums = empty({kParams});
    for (int i = 0; i < kReps; ++i) {
      comm.barrier();
      auto start = Clock::now();
      comm.all_reduce(grad, ReduceOp::sum);
      if (comm.rank() == 0) grad_before.push_back(seconds_since(start));
      comm.barrier();
      start = Clock::now();
      comm.reduce_units(partials, units, sums);
      if (comm.rank() == 0) grad_exact.push_back(seconds_since(start));
    }
    Tensor one = zeros({1});
    for (int i = 0; i < 100; ++i) comm.all_reduce(one, ReduceOp::sum);
    comm.barrier();
    auto start = Clock::now();
    for (int i = 0; i < kCalls; ++i) comm.all_reduce(one, ReduceOp::sum);
    if (comm.rank() == 0) {
      per_call_latency = seconds_since(start) / kCalls;
      world = comm.world_size();
      lead = 1;
    }
#if VQDDP_HAVE_MPI
    if (comm.backend() == "mpi") {
      for (int i = 0; i < kReps; ++i) {
        comm.barrier();
        auto at = Clock::now();
        MPI_Allreduce(MPI_IN_PLACE, t.raw_data(), static_cast<int>(kFloats), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (comm.rank() == 0) native_times.push_back(seconds_since(at));
      }
      comm.barrier();
      auto at = Clock::now();
      for (int i = 0; i < kCalls; ++i) MPI_Allreduce(MPI_IN_PLACE, one.raw_data(), 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      if (comm.rank() == 0) native_latency = seconds_since(at) / kCalls;
    }
#endif
  });
  if (!lead) return 0;  // another process of an mpi job: rank 0 reports
  double reduce_bw = kBytes / bench::median(reduce_times);

  fmt::print("{} backend, {} ranks on {} cores\n", backend, world, std::thread::hardware_concurrency());
  fmt::print("memcpy 64 MiB:               {:8.2f} ms  {:6.2f} GB/s\n", kBytes / copy_bw * 1e3, copy_bw / 1e9);
  fmt::print("all_reduce(sum) 64 MiB x {}:  {:8.2f} ms  {:6.2f} GB/s effective (bytes per rank / time)\n", world,
             kBytes / reduce_bw * 1e3, reduce_bw / 1e9);
  fmt::print("ratio all_reduce / memcpy bandwidth: {:.3f}\n", reduce_bw / copy_bw);
  fmt::print("main job gradient per step: all_reduce of {} floats {:.3f} ms ({:.2f} MB per rank); reduce_units of {} "
             "units {:.3f} ms ({:.2f} MB of partials in all); ratio {:.2f}\n", kParams,
             bench::median(grad_before) * 1e3, kParams * 4 / 1e6, kUnits, bench::median(grad_exact) * 1e3,
             kUnits * kParams * 4 / 1e6, bench::median(grad_exact) / bench::median(grad_before));
  fmt::print("all_reduce(sum) of 1 float x {}: {:.2f} us per call ({:.0f}x a 4-byte memcpy of {:.1f} ns)\n", world,
             per_call_latency * 1e6, per_call_latency / copy_one, copy_one * 1e9);
  if (!native_times.empty())
    fmt::print("MPI's own MPI_Allreduce (unordered): 64 MiB {:.2f} ms (ours / it: {:.2f}x), 1 float {:.2f} us (ours / "
               "it: {:.2f}x)\n",
               bench::median(native_times) * 1e3, bench::median(reduce_times) / bench::median(native_times),
               native_latency * 1e6, per_call_latency / native_latency);
  return 0;
}
