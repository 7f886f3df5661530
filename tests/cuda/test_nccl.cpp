// The NCCL backend on this machine's first GPU with a world of one (NCCL
// refuses two ranks on one GPU; tests/cuda/nccl_peer.cpp is the
// multi-process suite for machines with several): the closed-form checks
// on GPU and host tensors, stream ordering with the rank's compute stream,
// the fingerprint check's own collective, and the init deadline.
#include <algorithm>

#include "comm/nccl_communicator.h"
#include "comm/store.h"
#include "engine/device.h"
#include "engine/ops.h"
#include "tests/comm/closed_form.h"
#include "tests/cuda/gpu.h"

using namespace vqddp;
using namespace vqddp::test;
using namespace std::chrono_literals;

namespace {

const DistEnv kAlone{.rank = 0, .world_size = 1, .local_rank = 0, .master_addr = "127.0.0.1", .master_port = 0};

std::unique_ptr<Communicator> alone(NcclOptions o = {.timeout = 30s}) { return make_nccl_communicator(kAlone, nullptr, o); }

}  // namespace

TEST_CASE("nccl, world of one: closed-form collectives on cuda:0 and on host tensors" * doctest::skip(!nccl_built())) {
  auto comm = alone();
  CHECK(comm->backend() == "nccl");
  CHECK(comm->device() == kGpu);
  closed_form_collectives(*comm, kGpu);
  closed_form_collectives(*comm, kCpu);  // staged through the GPU
}

TEST_CASE("nccl, world of one: with the fingerprint check and blocking waits on" * doctest::skip(!nccl_built())) {
  auto comm = alone({.timeout = 30s, .check_fingerprints = true, .blocking = true});
  closed_form_collectives(*comm, kGpu);
}

TEST_CASE("nccl: collectives are ordered after the rank's queued work and before its later work" *
          doctest::skip(!nccl_built())) {
  auto comm = alone();
  // A long chain of kernels on the compute stream writes x, an out-of-place
  // all_gather copies it to g, and more kernels read g. Without the event
  // before the collective it would copy a stale x (zeros or a partial sum);
  // without the one after it, mul would read g before it is written.
  for (int round = 0; round < 3; ++round) {
    Tensor x = zeros({1 << 22}, DType::f32, kGpu);
    for (int i = 0; i < 50; ++i) x = add(x, full({}, 1.0, DType::f32, kGpu));
    Tensor g = full({1 << 22}, -7.0, DType::f32, kGpu);
    comm->all_gather(x, g);
    std::vector<float> v = mul(g, full({}, 2.0, DType::f32, kGpu)).to_vector<float>();
    CHECK(std::all_of(v.begin(), v.end(), [](float f) { return f == 100.f; }));
  }
}

TEST_CASE("nccl: a tensor on another device is refused naming both devices" * doctest::skip(!nccl_built())) {
  if (cuda_device_count() < 2) return;
  auto comm = alone();
  Tensor t = zeros({4}, DType::f32, Device::cuda(1));
  CHECK_THROWS_WITH_AS(comm->all_reduce(t, ReduceOp::sum), doctest::Contains("a tensor on cuda:1 in a collective of the "
                                                                             "communicator on cuda:0"),
                       Error);
}

TEST_CASE("nccl: a rank whose peers never start fails its init at the deadline, not a hang" *
          doctest::skip(!nccl_built())) {
  auto store = std::make_unique<TcpStore>("127.0.0.1", 0, true, 2s);
  DistEnv env{.rank = 0, .world_size = 2, .local_rank = 0, .master_addr = "127.0.0.1", .master_port = store->port()};
  auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(make_nccl_communicator(env, std::move(store), {.timeout = 2s}),
                       doctest::Contains("communicator init (world 2, cuda:0) did not complete within 2000 ms"),
                       TimeoutError);
  CHECK(std::chrono::steady_clock::now() - start < 60s);
}
