// The engine's thread pool (engine/cpu/parallel.h): whatever the gap
// between jobs (its helper found polling, or asleep after polling for a
// while), parallel_for returns only when every task has run, each once,
// and raises a task's exception on the caller.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "engine/cpu/parallel.h"

using namespace vqddp;

namespace {

// Busy for about `us` microseconds, so a helper is still inside a task
// when a caller that did not wait for it would return.
void busy(int us) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  while (std::chrono::steady_clock::now() < until) cpu_relax();
}

struct Threads {
  int saved = cpu_threads();
  explicit Threads(int n) { cpu_set_threads(n); }
  ~Threads() { cpu_set_threads(saved); }
};

}  // namespace

TEST_CASE("the pool runs every task once before parallel_for returns, after short and long gaps") {
  Threads threads(2);
  constexpr int kTasks = 16;
  // 0: the helper is still polling for the next job; 3 ms: it has gone to
  // sleep and must be woken.
  for (int gap_us : {0, 200, 3000}) {
    CAPTURE(gap_us);
    for (int job = 0; job < 12; ++job) {
      std::vector<std::atomic<int>> runs(kTasks);
      std::atomic<int> done{0};
      parallel_for(kTasks, [&](int64_t t) {
        busy(20);
        runs[t].fetch_add(1);
        done.fetch_add(1);
      });
      REQUIRE(done.load() == kTasks);
      for (int t = 0; t < kTasks; ++t) REQUIRE(runs[t].load() == 1);
      std::this_thread::sleep_for(std::chrono::microseconds(gap_us));
    }
  }
}

TEST_CASE("parallel_for waits for a helper whose task outlasts the caller's polling") {
  Threads threads(2);
  const std::thread::id caller = std::this_thread::get_id();
  int helped = 0;
  // Until a helper took a task in 3 jobs (on a loaded machine it may be
  // too late for some): each of the caller's tasks lasts 0.3 ms, so the
  // helper, polling since the last job, has time to take one.
  for (int job = 0; job < 100 && helped < 3; ++job) {
    std::atomic<int> done{0};
    std::atomic<bool> helper_ran{false};
    // A task the helper takes lasts 3 ms, longer than the caller polls
    // (1 ms): the caller must sleep until the helper reports.
    parallel_for(4, [&](int64_t) {
      if (std::this_thread::get_id() != caller) {
        helper_ran.store(true);
        busy(3000);
      } else {
        busy(300);
      }
      done.fetch_add(1);
    });
    REQUIRE(done.load() == 4);
    helped += helper_ran.load();
  }
  CHECK(helped > 0);  // else the case proved nothing: no helper ever took a task
}

TEST_CASE("a task's exception reaches parallel_for's caller, and the pool runs on") {
  Threads threads(2);
  for (int round = 0; round < 3; ++round) {
    std::atomic<int> done{0};
    CHECK_THROWS_WITH_AS(parallel_for(8,
                                      [&](int64_t t) {
                                        busy(10);
                                        done.fetch_add(1);
                                        if (t == 5) throw std::runtime_error("task 5 failed");
                                      }),
                         "task 5 failed", std::runtime_error);
    CHECK(done.load() == 8);  // the other tasks ran to their end first
    std::atomic<int> after{0};
    parallel_for(8, [&](int64_t) { after.fetch_add(1); });
    CHECK(after.load() == 8);
  }
}

TEST_CASE("poll_for: true as soon as the condition holds, never asked again; false after its limit") {
  int asked = 0;
  CHECK(poll_for(std::chrono::seconds(10), [&] { return ++asked == 100; }));  // a limit no load reaches
  CHECK(asked == 100);
  const auto start = std::chrono::steady_clock::now();
  CHECK_FALSE(poll_for(std::chrono::microseconds(2000), [] { return false; }));
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::microseconds(2000));
}
