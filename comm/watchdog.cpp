#include "comm/watchdog.h"

#include <fmt/format.h>

#include <algorithm>

namespace vqddp {

using Clock = std::chrono::steady_clock;

Watchdog::Watchdog(Hooks hooks, std::chrono::milliseconds poll)
    : hooks_(std::move(hooks)), poll_(poll), thread_([this] { loop(); }) {}

Watchdog::~Watchdog() { stop(); }

void Watchdog::watch(uint64_t seq, std::string what, std::chrono::milliseconds timeout, std::function<bool()> done,
                     std::function<void()> retire) {
  std::lock_guard lock(mu_);
  incoming_.push_back({seq, std::move(what), Clock::now() + timeout, timeout, std::move(done), std::move(retire)});
}

bool Watchdog::failed() const {
  std::lock_guard lock(mu_);
  return failed_;
}

void Watchdog::check() const {
  std::lock_guard lock(mu_);
  if (failed_) throw_comm_failure(kind_, message_);
}

bool Watchdog::record_failure(CommFailure kind, const std::string& message) {
  std::lock_guard lock(mu_);
  if (failed_) return false;
  failed_ = true;
  kind_ = kind;
  message_ = message;
  cv_.notify_all();
  return true;
}

void Watchdog::fail(CommFailure kind, const std::string& message) {
  if (record_failure(kind, message) && hooks_.abort) hooks_.abort();
}

void Watchdog::wait_until(const std::function<bool()>& done) const {
  // Short sleeps: a collective usually completes within microseconds to
  // milliseconds, and this wait is on the critical path of a barrier.
  auto pause = std::chrono::microseconds(20);
  while (true) {
    check();
    if (done()) return;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
}

std::string Watchdog::poll(CommFailure& kind) {
  // The backend's error state first: a failed peer shows up there before
  // any deadline passes.
  if (hooks_.async_error) {
    std::string error = hooks_.async_error();
    if (!error.empty()) {
      kind = CommFailure::aborted;
      std::string in_flight = owned_.empty() ? "no collective in flight"
                                             : fmt::format("in flight: {} #{}", owned_.front().what, owned_.front().seq);
      return fmt::format("communication error: {} ({}); the communicator was aborted", error, in_flight);
    }
  }
  auto now = Clock::now();
  for (auto it = owned_.begin(); it != owned_.end();) {
    if (it->done()) {
      if (it->retire) it->retire();
      it = owned_.erase(it);
      continue;
    }
    if (now > it->deadline) {
      kind = CommFailure::timeout;
      return deadline_message(it->what, it->seq, it->timeout);
    }
    ++it;
  }
  return "";
}

std::string Watchdog::deadline_message(const std::string& what, uint64_t seq, std::chrono::milliseconds timeout) {
  return fmt::format("{} #{} did not complete within its deadline of {} ms; the communicator was aborted "
                     "(a rank is missing, stuck, or called a different collective)",
                     what, seq, timeout.count());
}

void Watchdog::loop() {
  if (hooks_.thread_init) hooks_.thread_init();
  std::unique_lock lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, poll_, [&] { return stopping_; });
    if (stopping_) break;
    owned_.splice(owned_.end(), incoming_);
    bool already_failed = failed_;
    lock.unlock();  // the hooks may take the backend's locks: never call them under ours
    if (!already_failed) {
      CommFailure kind = CommFailure::aborted;
      std::string message = poll(kind);
      if (!message.empty()) fail(kind, message);
    }
    if (failed()) {
      // Nothing queued will be waited for any more: let go of it all.
      for (Entry& e : owned_)
        if (e.retire) e.retire();
      owned_.clear();
    }
    lock.lock();
  }
}

void Watchdog::stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  owned_.splice(owned_.end(), incoming_);
  for (Entry& e : owned_)
    if (e.retire) e.retire();
  owned_.clear();
}

}  // namespace vqddp
