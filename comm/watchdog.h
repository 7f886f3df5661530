// The watchdog of a backend whose collectives run asynchronously (NCCL):
// the caller queues a collective on a GPU stream and returns at once, so
// nobody would notice a collective that never completes (a rank died, hung,
// or called something else) or an error the library reports later. The
// watchdog's thread polls every watched collective's completion and the
// backend's asynchronous error state; on an error, or when a collective
// passes its deadline, it records the failure and calls the backend's abort
// (ncclCommAbort), which ends the queued GPU work so the process does not
// hang. The caller's thread then gets the failure as an exception
// (TimeoutError, AbortedError) naming the collective, its sequence number
// and the deadline, at its next collective or wait.
//
// It knows nothing about CUDA or NCCL: completion, error state and abort
// are callbacks, so its timing logic is tested on the CPU with fakes.
// Internal header: not installed with the library (the backends' collective timeout).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <thread>

#include "comm/errors.h"

namespace vqddp {

class Watchdog {
 public:
  struct Hooks {
    // "" while healthy, else what went wrong (polled from the watchdog's
    // thread; may return "" when it cannot tell right now).
    std::function<std::string()> async_error;
    // Ends the communicator and everything queued on it; called once, from
    // the watchdog's thread, after the failure is recorded.
    std::function<void()> abort;
    // Runs first on the watchdog's thread (CUDA: make the rank's GPU current,
    // so polling its events never creates a context on another GPU).
    std::function<void()> thread_init;
  };
  explicit Watchdog(Hooks hooks, std::chrono::milliseconds poll = std::chrono::milliseconds(10));
  ~Watchdog();  // stop()
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Watches collective `what` (#seq) until done() returns true, or fails the
  // group when it has not by `timeout` from now. `retire` (may be empty) runs
  // once when the watchdog lets go of it: done, failed, or stopped. Both run
  // on the watchdog's thread.
  void watch(uint64_t seq, std::string what, std::chrono::milliseconds timeout, std::function<bool()> done,
             std::function<void()> retire = {});

  // Throws the recorded failure, if any.
  void check() const;
  bool failed() const;
  // Records a failure found by the caller (the first one stays) and aborts.
  void fail(CommFailure kind, const std::string& message);
  // Records it without calling abort (the caller has aborted already, or
  // the communicator is consistent and only the program is not).
  void record(CommFailure kind, const std::string& message) { record_failure(kind, message); }
  // Waits in the caller until done() is true (polling it), throwing the
  // failure as soon as one is recorded (a watched collective's deadline
  // ends the wait).
  void wait_until(const std::function<bool()>& done) const;

  // Ends the thread; collectives still watched are retired unchecked.
  void stop();

  // The text of a missed deadline, for the watchdog and for backends that
  // find one themselves: "<what> #<seq> did not complete within its
  // deadline of <timeout> ms; the communicator was aborted (...)".
  static std::string deadline_message(const std::string& what, uint64_t seq, std::chrono::milliseconds timeout);

 private:
  struct Entry {
    uint64_t seq;
    std::string what;
    std::chrono::steady_clock::time_point deadline;
    std::chrono::milliseconds timeout;
    std::function<bool()> done;
    std::function<void()> retire;
  };
  void loop();
  // Polls the entries the thread owns; returns a failure message or "".
  std::string poll(CommFailure& kind);
  bool record_failure(CommFailure kind, const std::string& message);  // true if it was the first

  const Hooks hooks_;
  const std::chrono::milliseconds poll_;
  std::list<Entry> owned_;  // touched by the watchdog's thread only (and by stop() after the join)

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::list<Entry> incoming_;
  bool stopping_ = false;
  bool failed_ = false;
  CommFailure kind_ = CommFailure::aborted;
  std::string message_;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace vqddp
