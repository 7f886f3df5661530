#include "comm/rendezvous.h"

#include <fmt/format.h>

#include <cstdlib>

#include "comm/slurm_env.h"
#include "engine/core/error.h"
#include "engine/core/parse_number.h"

namespace vqddp {

std::unique_ptr<Store> rendezvous_store(const DistEnv& env, const std::function<const char*(const char*)>& lookup,
                                        std::chrono::milliseconds timeout) {
  if (const char* dir = lookup("VQDDP_STORE_DIR"); dir && *dir) return std::make_unique<FileStore>(dir, timeout);
  const char* bind = lookup("VQDDP_STORE_BIND");
  // Ranks beyond this node's (torchrun and vqddp launch set LOCAL_WORLD_SIZE).
  const char* local = lookup("LOCAL_WORLD_SIZE");
  std::optional<int64_t> local_world = local ? parse_int(local) : std::nullopt;
  bool remote = local_world && *local_world < env.world_size;
  return std::make_unique<TcpStore>(
      env.master_addr, env.master_port, env.rank == 0, timeout,
      TcpStoreOptions{.token = env.store_token, .bind_addr = bind ? bind : "", .remote_peers = remote});
}

ProcessGroup process_group(std::chrono::milliseconds timeout) {
  // srun's variables stand for torchrun's (LOCAL_WORLD_SIZE included).
  const EnvLookup lookup = with_slurm_step([](const char* name) -> const char* { return std::getenv(name); });
  ProcessGroup g;
  if (!dist_env_present(lookup)) return g;
  g.env = dist_env_from(lookup);
  if (g.env.world_size > 1) g.store = rendezvous_store(g.env, lookup, timeout);
  return g;
}

std::string share_from_rank0(Store& store, const DistEnv& env, const std::string& name,
                             const std::function<std::string()>& make) {
  // Keys carry the master port, so a file store directory reused by a run
  // with another port cannot hand out a previous run's blob.
  std::string key = fmt::format("vqddp/{}/{}", env.master_port, name);
  if (env.rank == 0) {
    std::string blob = make();
    store.set(key, fmt::format("{}:", env.world_size) + blob);
    return blob;
  }
  std::string value = store.get(key);
  size_t colon = value.find(':');
  std::optional<int64_t> world = colon == std::string::npos ? std::nullopt : parse_int(value.substr(0, colon));
  VQDDP_CHECK(world, "rendezvous: the value of '{}' is not from a vqddp rank 0", key);
  VQDDP_CHECK(*world == env.world_size,
              "rendezvous: rank {} has WORLD_SIZE={} but rank 0 has WORLD_SIZE={} (every process must be launched with "
              "the same world size)",
              env.rank, env.world_size, *world);
  return value.substr(colon + 1);
}

}  // namespace vqddp
