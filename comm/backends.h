// Choosing a backend at run time by name, so vq/ and train/ never name a
// concrete one: they call launch_ranks with what the config or command line
// says ("single", "thread"; "nccl" and "mpi" where built).
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace vqddp {

struct LaunchOptions {
  std::string backend = "thread";
  int world_size = 1;  // threads of "thread"; "nccl" takes it from WORLD_SIZE, "mpi" from MPI
  std::chrono::milliseconds timeout = std::chrono::minutes(5);  // per wait in a collective
  // "nccl", "mpi": compare every collective's fingerprint across ranks first
  // (the thread backend always does). Also on with VQDDP_NCCL_CHECK=1 /
  // VQDDP_MPI_CHECK=1.
  bool check_collectives = false;
};

// Runs fn once per local rank with that rank's communicator and returns when
// all are done; the first exception of any rank is rethrown. With "nccl"
// and "mpi" this process is ONE rank: fn runs once, on this process's
// communicator; with "mpi" in a world of several, an exception ends the
// whole MPI job (its message printed, then MPI_Abort) instead of returning.
// Unknown backend names are an error that lists the known ones.
void launch_ranks(const LaunchOptions& options, const std::function<void(Communicator&)>& fn);

std::vector<std::string> backend_names();

}  // namespace vqddp
