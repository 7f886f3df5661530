#include "comm/dist_env.h"

#include <cstdlib>

#include "comm/slurm_env.h"
#include "engine/core/error.h"
#include "engine/core/parse_number.h"

namespace vqddp {

namespace {

int integer_var(const std::function<const char*(const char*)>& lookup, const char* name, int low, int high) {
  const char* v = lookup(name);
  VQDDP_CHECK(v && *v, "environment variable {} is not set (a multi-process run needs RANK, WORLD_SIZE, LOCAL_RANK, "
              "MASTER_ADDR and MASTER_PORT; `vqddp launch` sets them, and srun's SLURM_* variables stand for them)", name);
  return static_cast<int>(parse_count(v, {low, high}, fmt::format("environment variable {}", name)));
}

}  // namespace

DistEnv dist_env_from(const std::function<const char*(const char*)>& launched) {
  const EnvLookup lookup = with_slurm_step(launched);
  DistEnv e;
  e.world_size = integer_var(lookup, "WORLD_SIZE", 1, kMaxWorldSize);
  e.rank = integer_var(lookup, "RANK", 0, kMaxWorldSize);
  VQDDP_CHECK(e.rank < e.world_size, "RANK={} is not below WORLD_SIZE={}", e.rank, e.world_size);
  e.local_rank = integer_var(lookup, "LOCAL_RANK", 0, kMaxWorldSize);
  VQDDP_CHECK(e.local_rank <= e.rank, "LOCAL_RANK={} exceeds RANK={}", e.local_rank, e.rank);
  const char* addr = lookup("MASTER_ADDR");
  VQDDP_CHECK(addr && *addr, "environment variable MASTER_ADDR is not set (the host of rank 0)");
  e.master_addr = addr;
  e.master_port = integer_var(lookup, "MASTER_PORT", 1, 65535);
  if (const char* token = lookup("VQDDP_STORE_TOKEN")) e.store_token = token;
  return e;
}

DistEnv dist_env_from_process() {
  return dist_env_from([](const char* name) { return std::getenv(name); });
}

bool dist_env_present(const std::function<const char*(const char*)>& lookup) {
  if (in_slurm_step(lookup)) return true;
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"})
    if (const char* v = lookup(name); v && *v) return true;
  return false;
}

}  // namespace vqddp
