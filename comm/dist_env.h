// The process group a multi-process run belongs to, read from the variables
// that torchrun, `vqddp launch` and srun wrappers set:
//   RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
// and, optional, VQDDP_STORE_TOKEN: the secret every request to the TCP
// store carries (comm/store.h; `vqddp launch` sets a random one per run).
// Missing or inconsistent values are errors that name the variable, so a
// mistyped launch script fails at start instead of hanging in a rendezvous.
#pragma once

#include <functional>
#include <string>

namespace vqddp {

inline constexpr int kMaxWorldSize = 1 << 20;

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr;
  int master_port = 0;
  // VQDDP_STORE_TOKEN, "" when unset. (`= {}`: designated initializers that
  // leave it out raise no -Wmissing-field-initializers.)
  std::string store_token = {};
};

// `lookup` returns a variable's value or nullptr (dist_env_from_process:
// std::getenv). In a Slurm job step, srun's variables stand for those the
// user did not set (comm/slurm_env.h).
DistEnv dist_env_from(const std::function<const char*(const char*)>& lookup);
DistEnv dist_env_from_process();
// True when any of the five variables is set, or this is a task of a Slurm
// job step: a launcher meant this process to be one rank of a group (and
// dist_env_from then checks all of them).
bool dist_env_present(const std::function<const char*(const char*)>& lookup);

}  // namespace vqddp
