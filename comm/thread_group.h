// The thread backend: W ranks as W threads of one process.
//
// This is how DDP semantics are tested without GPUs and reproduced bit for
// bit: every collective is a rendezvous of all W ranks in one slot.
//   1. Arrive: each rank publishes its fingerprint and buffers. The last to
//      arrive compares all fingerprints; a mismatch aborts the group with a
//      DesyncError naming the sequence number and every rank's fingerprint.
//   2. Work: each rank processes its own slice of the elements, combining
//      the ranks' values for each element in ascending rank order, and
//      writes the result into every rank's buffer. Each element is thus
//      reduced exactly as one thread would reduce it, so results are bitwise
//      identical on all ranks and run to run, and the work still spreads
//      over the ranks.
//   3. Complete: a second rendezvous, so no rank reuses its buffer while
//      another still reads it.
// Every wait has a deadline. A rank that does not arrive in time makes the
// waiters throw a TimeoutError naming the collective and the missing ranks;
// a rank that returned from its function while others wait in a collective
// is reported at once (DesyncError). Any exception aborts the group: every
// waiter wakes, and every later call throws AbortedError.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/fingerprint.h"

namespace vqddp {

struct ThreadGroupOptions {
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
};

class ThreadGroup {
 public:
  explicit ThreadGroup(int world_size, ThreadGroupOptions options = {});
  ~ThreadGroup();
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;

  int world_size() const { return world_size_; }
  // The communicator of `rank`; use it from that rank's thread only.
  Communicator& communicator(int rank);

  // Fails the group: wakes every waiter; this and every later call throw an
  // error of the given kind with `message`. The first abort's reason stays.
  using Failure = CommFailure;
  void abort(Failure kind, const std::string& message);
  // Tells the group `rank` will make no more calls.
  void rank_finished(int rank);

 private:
  friend class ThreadCommunicator;
  struct Call {
    Fingerprint fp;
    uint64_t seq = 0;
    const void* in = nullptr;  // this rank's input
    void* out = nullptr;       // this rank's output (== in for all_reduce, broadcast)
  };
  // Phase 1 (publish `call`, wait for all, check fingerprints) or phase 2
  // (wait for all to finish their work). Throws on abort, desync, timeout.
  void rendezvous(int rank, const Call* call, const char* phase);
  const Call& call_of(int rank) const { return calls_[rank]; }
  [[noreturn]] void throw_failure() const;  // requires the lock
  // Records the group's first failure and wakes every waiter; requires the lock.
  void fail_locked(Failure kind, const std::string& message);
  std::string missing_ranks() const;        // requires the lock

  const int world_size_;
  const ThreadGroupOptions options_;
  std::vector<std::unique_ptr<Communicator>> comms_;

  std::mutex mu_;
  std::condition_variable cv_;
  // Completed rendezvous; atomic so a waiter can poll it without the lock.
  std::atomic<uint64_t> generation_{0};
  // Whether a waiter polls before it sleeps: only when every rank has a
  // core of its own (W <= cores), so polling takes no core a rank needs.
  const bool spin_;
  int arrived_ = 0;
  std::vector<char> here_;     // arrived at the current rendezvous
  std::vector<char> finished_; // returned from its function
  std::vector<Call> calls_;
  std::atomic<bool> failed_{false};  // written under the lock; atomic so a waiter can poll it
  Failure failure_ = Failure::aborted;
  std::string failure_message_;
};

// Runs fn(comm) on W threads, one per rank, and joins them. If any rank
// throws, the group is aborted (the others wake with AbortedError instead of
// hanging) and the FIRST exception is rethrown here. While the ranks run,
// OpenBLAS gets max(1, min(its thread count, cores / W)) threads so concurrent GEMMs do not
// oversubscribe the machine.
void run_ranks(int world_size, const std::function<void(Communicator&)>& fn, ThreadGroupOptions options = {});

}  // namespace vqddp
