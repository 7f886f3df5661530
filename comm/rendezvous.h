// How the processes of a group find each other before any collective
// exists: rank 0 makes a blob (NCCL's ncclUniqueId) and publishes it in a
// key-value store; every other rank waits for it, with the store's deadline.
// Internal header: not installed with the library (the launcher's rendezvous).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "comm/dist_env.h"
#include "comm/store.h"

namespace vqddp {

// The store of a group: a FileStore in $VQDDP_STORE_DIR when that is set (a
// directory every node sees on a shared file system; use a fresh one per
// run), else the TCP store on MASTER_ADDR:MASTER_PORT, served by rank 0 on
// the address MASTER_ADDR names, or on $VQDDP_STORE_BIND when that is set
// (VQDDP_STORE_BIND=0.0.0.0: every interface), with env.store_token.
std::unique_ptr<Store> rendezvous_store(const DistEnv& env, const std::function<const char*(const char*)>& lookup,
                                        std::chrono::milliseconds timeout);

// This process's place in the group its launcher described (`vqddp launch`,
// torchrun, srun), with the group's store; a world of one without a store
// when none of the variables is set.
struct ProcessGroup {
  DistEnv env;
  std::shared_ptr<Store> store;  // null for a world of one
};
ProcessGroup process_group(std::chrono::milliseconds timeout);

// Rank 0 returns make() after publishing it under `name`; every other rank
// returns what rank 0 published. The blob travels with rank 0's WORLD_SIZE,
// and a rank whose WORLD_SIZE differs fails at once naming both values (an
// inconsistent launch would otherwise hang in the communicator's init).
std::string share_from_rank0(Store& store, const DistEnv& env, const std::string& name,
                             const std::function<std::string()>& make);

}  // namespace vqddp
