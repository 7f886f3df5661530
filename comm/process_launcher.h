// `vqddp launch`: one process per local GPU (or per requested rank) with
// the variables a multi-process run reads (comm/dist_env.h), like
// torchrun's standalone mode. For several nodes, run it once per node with
// the same --nnodes, --master-addr and --master-port and that node's
// --node-rank, and the same VQDDP_STORE_TOKEN exported on every node.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vqddp {

inline constexpr int kLaunchMaxProcs = 4096;  // per node
// The exit status of a launch that stopped processes still running
// exit_grace_s after another exited 0 (124, as timeout(1)).
inline constexpr int kLaunchHungExit = 124;

struct LaunchSpec {
  // 64-bit as given on the command line: launch_processes checks the ranges
  // (and names the flag) before anything narrows them.
  int64_t nproc = 1;                   // processes on this node, 1..kLaunchMaxProcs
  int64_t nnodes = 1;
  int64_t node_rank = 0;               // 0..nnodes-1
  std::string master_addr = "127.0.0.1";
  int64_t master_port = 0;             // 0: a free local port (single node only)
  // Seconds the other processes may run on after the first one exits 0
  // (a rank stuck after training, waiting for a peer that has left); 0:
  // no limit.
  double exit_grace_s = 60;
  std::vector<std::string> command;    // program and arguments
};

// Starts the processes, waits for all of them and returns 0 if all exited
// 0. Each gets VQDDP_STORE_TOKEN, the secret of the rendezvous store: the
// launcher's own when it is set (required with nnodes > 1, so that every
// node's launcher hands out the same one), else 128 random bits in hex.
// When one fails, the others are sent SIGTERM (they would wait for it in
// a collective until their deadline otherwise) and its exit code is
// returned, after a line on stderr naming the rank. When some still run
// exit_grace_s after the first clean exit, they are sent SIGTERM too, a
// line names them, and kLaunchHungExit is returned. A process that
// outlives SIGTERM by a few seconds gets SIGKILL.
int launch_processes(const LaunchSpec& spec);

// A TCP port that was free a moment ago on this machine.
int free_local_port();

}  // namespace vqddp
