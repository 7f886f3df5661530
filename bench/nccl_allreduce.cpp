// NCCL all_reduce: bandwidth against a device-to-device copy, latency, and
// the cost of the debug fingerprint check. One process per GPU:
//   build/vqddp launch --nproc N -- build/bench/bench_nccl_allreduce
// (alone it is a world of one, where NCCL's all_reduce is a local copy).
// Prints, on rank 0: a 64 MiB float32 all_reduce(sum) as algorithm
// bandwidth (bytes / time) and bus bandwidth (x 2(W-1)/W, nccl-tests'
// convention) with their ratio to a cudaMemcpy-class copy of the same bytes
// on the same GPU in the same process; the latency of a 1-float
// all_reduce with the fingerprint check off and on, and of a host-tensor
// (staged) one. Not a test: numbers only.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <vector>

#include "bench/timing.h"
#include "comm/dist_env.h"
#include "comm/nccl_communicator.h"
#include "comm/rendezvous.h"
#include "engine/device.h"
#include "engine/core/tensor.h"

using namespace vqddp;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

// Median seconds of fn() over reps, each ended by a device synchronize.
template <class F>
double timed(DeviceKernels& k, int reps, F fn) {
  k.synchronize();
  return bench::median_ms([&] {
    fn();
    k.synchronize();
  }, reps) / 1e3;
}

}  // namespace

int main() {
  if (!nccl_built() || cuda_device_count() == 0) {
    fmt::print("bench_nccl_allreduce: needs a GPU and a build with NCCL\n");
    return 0;
  }
  auto [env, store] = process_group(60s);
  auto comm = make_nccl_communicator(env, store, {.timeout = 60s});
  Device dev = comm->device();
  DeviceKernels& k = device_kernels(dev);
  const int w = comm->world_size();
  constexpr int64_t kFloats = 64 * 1024 * 1024 / 4;
  constexpr double kBytes = kFloats * 4.0;
  constexpr int kReps = 9;

  Tensor src = full({kFloats}, 1.0, DType::f32, dev), dst = empty({kFloats}, DType::f32, dev);
  double copy_s = timed(k, kReps, [&] { dst.copy_(src); });
  comm->all_reduce(src, ReduceOp::sum);  // warm-up
  double reduce_s = timed(k, kReps, [&] {
    comm->barrier();
    comm->all_reduce(src, ReduceOp::sum);
  });
  double barrier_s = timed(k, kReps, [&] { comm->barrier(); });
  reduce_s = std::max(reduce_s - barrier_s, 1e-9);  // the barrier aligned the ranks; not part of the reduce

  auto latency = [&](Communicator& c, Device on) {
    Tensor one = zeros({1}, DType::f32, on);
    for (int i = 0; i < 50; ++i) c.all_reduce(one, ReduceOp::sum);
    c.barrier();
    constexpr int kCalls = 500;
    auto start = Clock::now();
    for (int i = 0; i < kCalls; ++i) c.all_reduce(one, ReduceOp::sum);
    k.synchronize();
    return std::chrono::duration<double>(Clock::now() - start).count() / kCalls;
  };
  double lat = latency(*comm, dev), lat_host = latency(*comm, Device::cpu());
  comm.reset();
  // The same with the fingerprint check on (a second communicator).
  auto checked = make_nccl_communicator(env, store, {.timeout = 60s, .check_fingerprints = true, .name = "checked"});
  double lat_checked = latency(*checked, dev);

  if (env.rank == 0) {
    double algbw = kBytes / reduce_s, busbw = algbw * (w > 1 ? 2.0 * (w - 1) / w : 1.0), copybw = kBytes / copy_s;
    fmt::print("nccl backend, {} rank(s), {}\n", w, dev.str());
    fmt::print("device copy 64 MiB:          {:8.3f} ms  {:7.1f} GB/s\n", copy_s * 1e3, copybw / 1e9);
    fmt::print("all_reduce(sum) 64 MiB:      {:8.3f} ms  algbw {:7.1f} GB/s  busbw {:7.1f} GB/s\n", reduce_s * 1e3,
               algbw / 1e9, busbw / 1e9);
    fmt::print("ratio busbw / device copy bandwidth: {:.3f}\n", busbw / copybw);
    fmt::print("all_reduce of 1 float: {:.1f} us (GPU tensor), {:.1f} us (host tensor, staged), {:.1f} us (fingerprint "
               "check on; ratio {:.2f})\n",
               lat * 1e6, lat_host * 1e6, lat_checked * 1e6, lat_checked / lat);
  }
  return 0;
}
