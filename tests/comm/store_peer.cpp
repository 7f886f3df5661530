// A process of a multi-process rendezvous test, started by `vqddp launch`
// or srun (whose variables stand for torchrun's, as in process_group):
// reads RANK/WORLD_SIZE/MASTER_* and VQDDP_STORE_TOKEN from the environment
// (rendezvous_store, as a real run does), rank 0 publishes an id through
// the TCP store, every rank reads it back and reports what it saw, and
// rank 0 checks that all agree. Exit 0 on agreement.
//   store_peer [--pretend-world N] [--timeout-ms T]
// --pretend-world makes rank 0 wait for N ranks (more than were launched),
// to show that a missing rank ends in a deadline error, not a hang.
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <exception>

#include "comm/dist_env.h"
#include "comm/rendezvous.h"
#include "comm/slurm_env.h"

int main(int argc, char** argv) {
  int pretend = 0;
  long timeout_ms = 10000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--pretend-world")) pretend = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--timeout-ms")) timeout_ms = std::atol(argv[i + 1]);
  }
  try {
    vqddp::DistEnv env = vqddp::dist_env_from_process();
    std::unique_ptr<vqddp::Store> owned =
        vqddp::rendezvous_store(env, vqddp::with_slurm_step([](const char* name) { return std::getenv(name); }),
                                std::chrono::milliseconds(timeout_ms));
    vqddp::Store& store = *owned;
    int world = pretend > 0 ? pretend : env.world_size;
    if (env.rank == 0) store.set("run_id", fmt::format("id-{}-{}", ::getpid(), env.master_port));
    std::string id = store.get("run_id");
    store.set(fmt::format("seen/{}", env.rank), id);
    if (env.rank == 0) {
      for (int r = 0; r < world; ++r) {
        std::string seen = store.get(fmt::format("seen/{}", r));
        if (seen != id) {
          fmt::print(stderr, "rank {} saw '{}', rank 0 published '{}'\n", r, seen, id);
          return 1;
        }
      }
      store.set("done", "1");
      // Keep the server up until every rank has read "done".
      for (int r = 1; r < world; ++r) store.get(fmt::format("bye/{}", r));
      fmt::print("store_peer: {} ranks agree on '{}'\n", world, id);
    } else {
      store.get("done");
      store.set(fmt::format("bye/{}", env.rank), "1");
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "store_peer: {}\n", e.what());
    return 2;
  }
}
