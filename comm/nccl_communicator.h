// The NCCL backend: one process per GPU, any number of nodes.
//
// Collectives run on CUDA tensors of the rank's GPU (cuda:LOCAL_RANK),
// queued on the communicator's own stream and ordered with the caller's
// compute stream by events: the collective starts after everything the rank
// queued before the call, and everything queued after the call waits for
// it. The call returns without waiting for the GPU. Host tensors are
// staged through the GPU (and then the call waits, since the host reads the
// result).
//
// Failure handling: the communicator is non-blocking, and a watchdog thread
// (comm/watchdog.h) polls ncclCommGetAsyncError and each queued
// collective's deadline. On an error or a missed deadline it aborts the
// communicator (ncclCommAbort ends the queued kernels, so no stream hangs)
// and the rank's next collective, barrier or staged call throws
// TimeoutError / AbortedError naming the collective, its sequence number
// and the deadline. Options:
//   check_fingerprints (VQDDP_NCCL_CHECK=1): before each collective the
//     ranks all_gather its fingerprint (kind, dtype, count, root, rows:
//     48 bytes per rank) and throw DesyncError listing every rank's call if
//     they differ, like the thread backend always does. Costs one small
//     collective and a host wait per call: a debug setting.
//   blocking (VQDDP_NCCL_BLOCKING=1): every collective waits in the caller
//     until it completed, so a failure is raised by the call that failed.
//
// Determinism: NCCL's reductions are deterministic run to run for a fixed
// world, topology and NCCL version, and every rank receives the same bits
// (each element is reduced once and then distributed), but the order in
// which ranks' values are combined is NCCL's (ring or tree), not rank
// order: with W > 1, a float sum may differ from the thread backend's in the
// last bits. So the library sends no float sum through it whose bits matter
// unless it is exact (the codebook statistics, vq/code_stats.h); the
// gradients go through reduce_units. With W = 1 every collective is an
// identity, bit for bit.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/dist_env.h"
#include "comm/store.h"

namespace vqddp {

struct NcclOptions {
  std::chrono::milliseconds timeout = std::chrono::minutes(5);  // per collective, and for the init
  bool check_fingerprints = false;
  bool blocking = false;
  // Several communicators of one group (same ranks) may share a store:
  // each rendezvous under its own name.
  std::string name = "default";
  // Options from VQDDP_NCCL_CHECK / VQDDP_NCCL_BLOCKING ("1" turns on).
  static NcclOptions from_environment(std::chrono::milliseconds timeout);
};

// True when this binary has the NCCL backend.
bool nccl_built();

// This process's rank of the group `env` describes, on cuda:env.local_rank.
// Rank 0 makes the ncclUniqueId and shares it through `store` under
// options.name (not needed, and may be null, for a world of 1); the
// communicator keeps a reference to the store.
// Throws naming the rank and the problem: no such GPU, a rendezvous or
// init that misses the deadline, a build without NCCL.
std::unique_ptr<Communicator> make_nccl_communicator(const DistEnv& env, std::shared_ptr<Store> store,
                                                     const NcclOptions& options);

}  // namespace vqddp
