#include "comm/nccl_communicator.h"

#include <cstdlib>
#include <cstring>
#include <exception>

#include "vqddp_config.h"

namespace vqddp {

NcclOptions NcclOptions::from_environment(std::chrono::milliseconds timeout) {
  auto on = [](const char* name) {
    const char* v = std::getenv(name);
    return v && std::strcmp(v, "1") == 0;
  };
  return {timeout, on("VQDDP_NCCL_CHECK"), on("VQDDP_NCCL_BLOCKING")};
}

}  // namespace vqddp

#if !VQDDP_HAVE_NCCL

namespace vqddp {

bool nccl_built() { return false; }

std::unique_ptr<Communicator> make_nccl_communicator(const DistEnv&, std::shared_ptr<Store>, const NcclOptions&) {
  VQDDP_THROW("backend 'nccl' is not in this build of vqddp (it was built without CUDA and NCCL; install the CUDA "
              "toolkit with NCCL and rebuild)");
}

}  // namespace vqddp

#else

#include "comm/nccl/module_entry.h"
#include "engine/cuda_module.h"

namespace vqddp {

bool nccl_built() { return true; }

// The backend lives in the CUDA module libvqddp_nccl.so, loaded here on the
// first call (engine/cuda_module.h).
std::unique_ptr<Communicator> make_nccl_communicator(const DistEnv& env, std::shared_ptr<Store> store,
                                                     const NcclOptions& options) {
  static std::string why;
  static const NcclEntry* nccl = cuda_module_call<const NcclEntry>("nccl", "vqddp_nccl_entry", why);
  VQDDP_CHECK(nccl, "rank {}: backend 'nccl' is not available: {}", env.rank, why);
  return nccl->make(env, std::move(store), options);
}

}  // namespace vqddp

#endif
