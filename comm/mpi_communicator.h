// The MPI backend: one process per rank, on any number of CPU nodes,
// started by mpirun or srun (rank and world size come from MPI itself).
//
// Bitwise equal to the thread backend: MPI's own reductions (MPI_Allreduce)
// do not promise the order in which ranks' values are combined, so none is
// used. all_reduce moves the data with MPI and reduces on the host with the
// thread backend's code (comm/rank_order.h), each element combined in
// ascending rank order:
//   - large tensors: a reduce-scatter by MPI_Ialltoallv (rank q receives
//     every rank's copy of its share, the thread backend's split) and a
//     rank-ordered reduce of that share, then MPI_Iallgatherv of the reduced
//     shares. Each rank sends and receives 2 (W-1)/W of the tensor, as a
//     ring all-reduce does, and holds one tensor-sized scratch buffer.
//   - small ones (W copies within kGatherReduceBytes): one MPI_Iallgather of
//     every rank's whole tensor and the reduce on every rank: one round
//     trip instead of two, W times the bytes (a few KiB).
// Either way the bits are those of `--backend thread --world W`.
//
// Deadlines: MPI has no timeouts, so every collective is a non-blocking MPI
// call that the caller polls (MPI_Test) until it completes or the
// communicator's deadline passes. Then the call throws TimeoutError naming
// the collective, its sequence number and the deadline, and every later
// call throws it again. MPI cannot cancel a collective the other ranks
// never join, so a failed communicator ends the job when it is destroyed:
// it prints the failure and calls MPI_Abort (mpirun then stops every
// process). So does one destroyed while an exception propagates (world > 1):
// the other ranks would otherwise wait for this one until their deadline.
//
// check_fingerprints (distributed.check_collectives, VQDDP_MPI_CHECK=1):
// before each collective the ranks all_gather its fingerprint (48 bytes per
// rank) and every rank throws DesyncError listing every rank's call if they
// differ. Without it, ranks that call different collectives are MPI's
// undefined behaviour (a mismatch may hang until the deadline, or fail).
// A desync seen by every rank leaves the communicator consistent: it is
// freed normally.
//
// MPI is initialised (MPI_THREAD_SERIALIZED: one thread at a time calls
// MPI) by the first communicator of the process, unless the program did it
// already, and then finalised at exit.
#pragma once

#include <chrono>
#include <memory>

#include "comm/communicator.h"

namespace vqddp {

struct MpiOptions {
  std::chrono::milliseconds timeout = std::chrono::minutes(5);  // per collective
  bool check_fingerprints = false;
  // From VQDDP_MPI_CHECK ("1" turns the check on).
  static MpiOptions from_environment(std::chrono::milliseconds timeout);
};

// The all_reduce size (W copies, bytes) up to which the gather-everything
// path is taken.
inline constexpr int64_t kGatherReduceBytes = 64 * 1024;
// The exit status MPI_Abort gives the job after a failure.
inline constexpr int kMpiAbortExit = 3;

// True when this binary has the MPI backend.
bool mpi_built();

// True when an MPI launcher started this process as one of several
// (mpirun: OMPI_COMM_WORLD_SIZE; srun and others: PMI_SIZE, PMIX_SIZE).
bool mpi_launched_world();

// This process's rank of MPI_COMM_WORLD, on a communicator of its own (a
// duplicate, so the program's own MPI traffic never matches ours). Every
// process must call it. Throws naming the problem: a build without MPI, a
// duplicate that misses the deadline.
std::unique_ptr<Communicator> make_mpi_communicator(const MpiOptions& options);

// Ends the MPI job from this rank after `message` (printed to stderr first,
// naming the rank): MPI_Abort with kMpiAbortExit. For a rank whose error the
// other ranks would otherwise only see as a missed deadline.
[[noreturn]] void mpi_abort_job(const std::string& message);

}  // namespace vqddp
