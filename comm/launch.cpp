#include "comm/launch.h"

#include "comm/nccl_communicator.h"
#include "comm/rendezvous.h"
#include "comm/single.h"
#include "comm/thread_group.h"

namespace vqddp {

namespace {

using Launcher = void (*)(const LaunchOptions&, const std::function<void(Communicator&)>&);

struct Backend {
  const char* name;
  Launcher launch;
};

void launch_single(const LaunchOptions& o, const std::function<void(Communicator&)>& fn) {
  VQDDP_CHECK(o.world_size == 1, "backend 'single' runs exactly one rank, asked for {}", o.world_size);
  SingleCommunicator comm;
  fn(comm);
}

void launch_thread(const LaunchOptions& o, const std::function<void(Communicator&)>& fn) {
  run_ranks(o.world_size, fn, {.timeout = o.timeout});
}

// This process is one rank of the group the environment describes (set by
// `vqddp launch`, torchrun or an srun wrapper); without any of those
// variables it is a world of one, so `vqddp train --backend nccl` runs on
// one GPU as is. The world size comes from WORLD_SIZE, not from options.
void launch_nccl(const LaunchOptions& o, const std::function<void(Communicator&)>& fn) {
  ProcessGroup group = process_group(o.timeout);
  NcclOptions nccl = NcclOptions::from_environment(o.timeout);
  nccl.check_fingerprints |= o.check_collectives;
  std::unique_ptr<Communicator> comm = make_nccl_communicator(group.env, group.store, nccl);
  fn(*comm);
}

// "nccl" is listed in every build; a build without NCCL says so when asked.
constexpr Backend kBackends[] = {{"single", launch_single}, {"thread", launch_thread}, {"nccl", launch_nccl}};

}  // namespace

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const Backend& b : kBackends) names.emplace_back(b.name);
  return names;
}

void launch_ranks(const LaunchOptions& options, const std::function<void(Communicator&)>& fn) {
  VQDDP_CHECK(options.world_size >= 1, "world size must be at least 1, got {}", options.world_size);
  for (const Backend& b : kBackends)
    if (options.backend == b.name) return b.launch(options, fn);
  VQDDP_THROW("unknown communication backend '{}' (known: {})", options.backend, fmt::join(backend_names(), ", "));
}

}  // namespace vqddp
