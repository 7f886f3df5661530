// Internal header: not installed.
//
// What the NCCL module (libvqddp_nccl.so, engine/cuda_module.h) gives the
// library: one entry, vqddp_nccl_entry, returning this.
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "comm/dist_env.h"
#include "comm/nccl_communicator.h"
#include "comm/store.h"

namespace vqddp {

struct NcclEntry {
  // make_nccl_communicator's work (comm/nccl_communicator.h).
  std::unique_ptr<Communicator> (*make)(const DistEnv& env, std::shared_ptr<Store> store, const NcclOptions& options);
};

}  // namespace vqddp
