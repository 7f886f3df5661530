#include "comm/launch.h"

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

// Backends that need optional libraries add their entry here under their
// build flag.
constexpr Backend kBackends[] = {{"single", launch_single}, {"thread", launch_thread}};

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
