// `vqddp launch`: one process per local GPU (or per requested rank) with
// the variables a multi-process run reads (comm/dist_env.h), like
// torchrun's standalone mode. For several nodes, run it once per node with
// the same --nnodes, --master-addr and --master-port and that node's
// --node-rank.
#pragma once

#include <string>
#include <vector>

namespace vqddp {

struct LaunchSpec {
  int nproc = 1;                       // processes on this node
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;                 // 0: a free local port (single node only)
  std::vector<std::string> command;    // program and arguments
};

// Starts the processes, waits for all of them and returns 0 if all exited
// 0. When one fails, the others are sent SIGTERM (they would wait for it in
// a collective until their deadline otherwise) and its exit code is
// returned, after a line on stderr naming the rank.
int launch_processes(const LaunchSpec& spec);

// A TCP port that was free a moment ago on this machine.
int free_local_port();

}  // namespace vqddp
