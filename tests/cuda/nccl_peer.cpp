// The NCCL suite for machines with several GPUs: one process per GPU,
// started by the launcher, each running the same doctest cases on its
// rank's communicator (same cases, same order: the collectives match).
//   build/vqddp launch --nproc 2 -- build/tests/nccl_peer
// Exits 77 (meson: SKIP) on every rank when the machine has fewer GPUs
// than WORLD_SIZE, or the build has no NCCL.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "comm/dist_env.h"
#include "comm/backends.h"
#include "comm/nccl_communicator.h"
#include "comm/rendezvous.h"
#include "engine/device.h"
#include "tests/comm/closed_form.h"

using namespace vqddp;
using namespace std::chrono_literals;

namespace {
DistEnv g_env;
std::shared_ptr<Store> g_store;  // one rendezvous store; each communicator meets under its own name
std::unique_ptr<Communicator> g_comm;
}  // namespace

TEST_CASE("nccl, one process per GPU: closed-form collectives on the GPU and on host tensors") {
  test::closed_form_collectives(*g_comm, g_comm->device());
  test::closed_form_collectives(*g_comm, Device::cpu());
}

TEST_CASE("nccl: ranks that call different collectives get a DesyncError on every rank with the fingerprint check") {
  // A second communicator (its own id, under another name in the store), so
  // the first stays usable for the cases after this one.
  auto comm = make_nccl_communicator(g_env, g_store, {.timeout = 30s, .check_fingerprints = true, .name = "desync"});
  Tensor t = zeros({8}, DType::f32, comm->device());
  comm->all_reduce(t, ReduceOp::sum);  // agreed: fine
  CHECK_THROWS_WITH_AS(comm->all_reduce(t, comm->rank() == 0 ? ReduceOp::sum : ReduceOp::max),
                       doctest::Contains("#1: ranks called different collectives"), DesyncError);
  CHECK_THROWS_AS(comm->barrier(), DesyncError);  // and every later call
}

TEST_CASE("nccl: a rank that skips a collective makes the others fail at the deadline, naming it") {
  auto comm = make_nccl_communicator(g_env, g_store, {.timeout = 3s, .name = "skip"});
  Tensor t = zeros({8}, DType::f32, comm->device());
  if (comm->rank() == 0) {
    comm->all_reduce(t, ReduceOp::sum);  // nobody else calls it
    CHECK_THROWS_WITH_AS(comm->barrier(), doctest::Contains("all_reduce(sum) float32 x8 #0 did not complete within its "
                                                            "deadline of 3000 ms"),
                         TimeoutError);
  } else {
    std::this_thread::sleep_for(5s);  // past rank 0's deadline, then a collective of its own
    CHECK_THROWS_AS(comm->barrier(), Error);
  }
}

int main(int argc, char** argv) {
  try {
    // Decide to skip from the environment alone, before the rendezvous:
    // every rank reaches the same answer without the store, so no rank
    // exits while another is still checking its token with rank 0's store
    // (which failed "nccl 2 processes" on a one-GPU machine when rank 0
    // skipped first). The processes of this node, one per GPU: vqddp launch
    // and torchrun set LOCAL_WORLD_SIZE; without it, assume a single node.
    const DistEnv env = dist_env_from_process();
    const char* local = std::getenv("LOCAL_WORLD_SIZE");
    int per_node = local ? std::atoi(local) : env.world_size;
    if (!nccl_built() || cuda_device_count() < per_node) {
      std::printf("nccl_peer skipped: %d GPU(s) for %d processes on this node%s\n", cuda_device_count(), per_node,
                  nccl_built() ? "" : " (no NCCL in this build)");
      return 77;
    }
    ProcessGroup group = process_group(60s);
    g_env = group.env;
    g_store = group.store;
    g_comm = make_nccl_communicator(g_env, g_store, {.timeout = 60s});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nccl_peer: %s\n", e.what());
    return 2;
  }
  doctest::Context context(argc, argv);
  int rc = context.run();
  g_comm.reset();
  g_store.reset();
  return rc;
}
