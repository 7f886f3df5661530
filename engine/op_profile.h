// Where a thread's time goes, op by op: `vqddp train --profile` prints it
// for rank 0's training steps (issue 33's measure-first tool).
//
// While enabled, every op an autograd graph records (record_op) is charged
// the time since the thread's previous charge: an op computes its output
// and then records itself, so that interval is its forward. Each backward
// formula is charged its own run (autograd.cpp, "NAME backward"), and code
// between ops names its part with op_profile_mark (the trainer's batch,
// optimizer and collectives). Only while an OpProfileScope lives on the
// thread (the trainer opens one per training step, so validation and
// logging are not in it); otherwise a mark costs one thread-local test.
// Internal header: not installed with the library (the trainer's --profile table).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/device.h"

namespace vqddp {

// Profiles this thread while it lives, from a restarted clock (not nestable).
// On a device other than the CPU every charge first waits for the work this
// thread queued there (DeviceKernels::synchronize), so each op is charged
// its kernels' time, not only their launch; the waits slow the run.
class OpProfileScope {
 public:
  explicit OpProfileScope(Device device = Device::cpu());
  ~OpProfileScope();
  OpProfileScope(const OpProfileScope&) = delete;
  OpProfileScope& operator=(const OpProfileScope&) = delete;
};
bool op_profile_enabled();  // inside a scope on this thread

// Charges the time since this thread's last charge to `what` and restarts
// its clock. No-op outside a scope.
void op_profile_mark(const char* what);
void op_profile_mark(const std::string& what);

// Each charge also takes the launches, layout-copy bytes and FLOPs the
// thread's device counted since the last one (device_counters.h), so the
// table says which op launches what, on sim as on cuda, and how fast each
// op computes (engine/kernel_flops.h), on every device.
struct OpProfileEntry {
  std::string name;
  int64_t calls = 0;
  double seconds = 0;
  int64_t launches = 0, layout_bytes = 0;
  int64_t flops = 0;
};

// This thread's charges since the last take, largest first; resets them.
std::vector<OpProfileEntry> op_profile_take();

// The GEMM floor a profile is measured against (engine/gemm_floor.h).
struct ProfileFloor {
  double gflops = 0;     // the machine's GEMM GFLOP/s; 0: no floor columns
  // The profiled thread's part of the world's FLOPs (1 for a world of one,
  // about 1/W for one of W ranks sharing the machine): its fair share of
  // the floor is gflops * share.
  double share = 1;
};

// A table: each entry's ms per step, share of the total, GFLOP per step,
// GFLOP/s, its percent of the thread's share of the floor (with a floor),
// calls, launches and layout-copy kilobytes per step; then the total.
std::string op_profile_table(const std::vector<OpProfileEntry>& entries, int64_t steps,
                             const ProfileFloor& floor = {});

}  // namespace vqddp
