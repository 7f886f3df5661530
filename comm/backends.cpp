#include "comm/backends.h"

#include <unistd.h>

#include <algorithm>
#include <climits>

#include "comm/errors.h"
#include "comm/mpi_communicator.h"
#include "comm/nccl_communicator.h"
#include "comm/rendezvous.h"
#include "comm/slurm_env.h"
#include "comm/single.h"
#include "comm/thread_group.h"
#include "engine/cpu/parallel.h"

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

// How many ranks of `comm` run on this machine: one all_gather of a hash of
// the host name.
int ranks_on_this_node(Communicator& comm) {
  auto mine = static_cast<int64_t>(std::hash<std::string>{}(host_name()));
  std::vector<int64_t> all = all_gather(comm, from_vector(std::vector<int64_t>{mine}, {1})).to_vector<int64_t>();
  return static_cast<int>(std::count(all.begin(), all.end(), mine));
}

// This process is one rank of the MPI job (mpirun, srun): rank and world
// come from MPI. The engine's CPU threads are shared among the job's
// processes on this node, as run_ranks shares them among thread ranks.
// An error on one rank ends the whole job at once (after its message):
// the others would only see it as a missed deadline, minutes later. One
// that every rank raised alike ends each process on its own.
void launch_mpi(const LaunchOptions& o, const std::function<void(Communicator&)>& fn) {
  MpiOptions mpi = MpiOptions::from_environment(o.timeout);
  mpi.check_fingerprints |= o.check_collectives;
  std::unique_ptr<Communicator> comm = make_mpi_communicator(mpi);
  try {
    CpuShareScope share(ranks_on_this_node(*comm));
    fn(*comm);
  } catch (const std::exception& e) {
    if (comm->world_size() > 1) {
      if (!raised_by_every_rank(e))
        mpi_abort_job(fmt::format("vqddp: mpi rank {} of {} on {} failed: {}", comm->rank(), comm->world_size(),
                                  this_node_name(), e.what()));
      // Every rank raised it at the same point (other data, config or
      // build): none waits for another, so each process frees its
      // communicator here (no exception in flight, so no abort), finalises
      // MPI at exit and fails with the error. MPI_Abort would end the job
      // too, but through a teardown in which mpirun itself has crashed (in
      // its PMIx log handler), losing the other ranks' messages.
      comm.reset();
    }
    throw;
  }
}

// "nccl" and "mpi" are listed in every build; a build without NCCL says so when asked.
constexpr Backend kBackends[] = {{"single", launch_single}, {"thread", launch_thread}, {"nccl", launch_nccl},
                                {"mpi", launch_mpi}};

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
