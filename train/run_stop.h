// How a run stops before its last step, every rank after the same step: a
// signal (SIGTERM from a scheduler) asked on any rank, or rank 0's run
// directory on a nearly full disk. Each is agreed by one all_reduce at the
// same point on every rank, so no rank runs a collective the others skip.
//
// Internal header: not installed with the library (the trainer's stops).
#pragma once

#include <cstdint>
#include <filesystem>

#include "comm/communicator.h"
#include "train/run_dir.h"
#include "train/trainer.h"

namespace vqddp {

class RunStop {
 public:
  RunStop(const TrainOptions& opt, Communicator& comm) : opt_(opt), comm_(comm) {}

  // Collective, after every step: a stop asked on any rank
  // (opt.stop_requested), agreed by all: one all_reduce (max) of the
  // received signal. Not after the last step (every rank knows `last`, so
  // all skip it): a stop asked then changes nothing, the run is complete.
  // No collective without opt.stop_requested.
  void agree_on_signal(int64_t done, int64_t last);
  // The signal that stopped the run (0: none).
  int stopped_by() const { return stopped_by_; }

  // Collective: whether rank 0's run directory is on a nearly full disk
  // (RunDir::disk_low; `run_dir` null: no directory, not low), agreed by
  // every rank (one all_reduce), with the free bytes rank 0 saw. True
  // marks step `done` as the one the run stops at.
  bool agree_disk_low(const RunDir* run_dir, int64_t done);
  // The step the run stopped at for a nearly full disk (0: none).
  int64_t disk_low_at() const { return disk_low_at_; }
  // The stop for a full disk, on every rank alike, once the step's
  // checkpoint is saved: an error, so a batch script sees the run did not
  // end, naming the way on.
  [[noreturn]] void stop_for_disk(const std::filesystem::path& dir) const;

 private:
  const TrainOptions& opt_;
  Communicator& comm_;
  Tensor flag_ = zeros({1}, DType::i64);  // the received signal, reused every step
  int stopped_by_ = 0;
  int64_t disk_low_at_ = 0;
  int64_t disk_free_ = -1;  // the bytes rank 0 saw free then (-1: unknown)
};

}  // namespace vqddp
