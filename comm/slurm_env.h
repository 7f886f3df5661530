// Internal header: not installed with the library (the launcher's variables).
// A Slurm job step as a launcher: `srun vqddp train --backend nccl` needs no
// wrapper script, because the variables srun gives each task name its place
// as torchrun's do (comm/dist_env.h):
//   RANK        <- SLURM_PROCID
//   WORLD_SIZE  <- SLURM_STEP_NUM_TASKS (SLURM_NTASKS in older Slurm)
//   LOCAL_RANK  <- SLURM_LOCALID
//   MASTER_ADDR <- the first node of SLURM_STEP_NODELIST (task 0's, in
//                  Slurm's default block distribution)
//   MASTER_PORT <- 15000 + (SLURM_JOB_ID % 1700) * 10 + SLURM_STEP_ID % 10,
//                  one port per job step, below the ephemeral ports
//   LOCAL_WORLD_SIZE <- this node's count in SLURM_STEP_TASKS_PER_NODE
// A variable the user set wins over Slurm's (MASTER_ADDR where node names
// do not resolve, MASTER_PORT where the derived one is taken). Only a job
// step counts: the batch script itself (no SLURM_STEP_ID) is one process,
// not rank 0 of the job's tasks.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace vqddp {

using EnvLookup = std::function<const char*(const char*)>;

// True when `lookup` describes a task of a Slurm job step.
bool in_slurm_step(const EnvLookup& lookup);
// `lookup` with torchrun's variables filled in from a Slurm job step's,
// where the user set none; `lookup` itself outside a job step.
EnvLookup with_slurm_step(const EnvLookup& lookup);
// The node this process runs on, for messages: "node n3" in a Slurm job
// step (SLURMD_NODENAME), else "" (the caller names the host).
std::string slurm_node_name(const EnvLookup& lookup);

// gethostname's answer.
std::string host_name();
// "node n3" in a Slurm job step, else "host NAME" (host_name): where this
// process runs, for the message that ends a job.
std::string this_node_name();

// Slurm's compressed host lists and task counts, as srun writes them.
// "gpu[07-09,12],login1" -> "gpu07". Errors name the text.
std::string slurm_first_host(const std::string& nodelist);
// "2(x3),1" and node 3 -> 1 (node ids from 0); nullopt past the list.
std::optional<int> slurm_tasks_on_node(const std::string& tasks_per_node, int node);

}  // namespace vqddp
