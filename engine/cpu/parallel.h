// The engine's CPU threads: one process-wide count shared by OpenBLAS (the
// backward GEMMs) and by our own kernels (engine/cpu/), and a small pool
// that runs our kernels' tasks.
//
// Ranks that compute concurrently on one machine (run_ranks' threads, an
// MPI job's processes on a node) share its cores through CpuShareScope.
// Our kernels' results never depend on how their tasks are spread over
// threads (each task owns whole output elements), so the count, and whether
// the pool was free, change speed only, never bits.
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <memory>
#include <thread>
#include <type_traits>

namespace vqddp {

// One round of a polling loop: tells the core it spins (x86 PAUSE), so a
// sibling hyperthread runs on and the loop does not flood the memory bus.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Polls `done` until it returns true (then true) or `limit` has passed by
// the clock (then done()'s last answer), and is never called again after
// true. For the first 50 µs it pauses between polls, after that it yields
// the core, so another thread that wants it gets it at once while a poll
// still sees the change within a microsecond or so. By the clock, not a
// count of rounds: x86's PAUSE takes from about 10 to 140 cycles by core.
// For waits that are usually over in microseconds (a pool's next job, a
// rendezvous), before they sleep on a condition variable, which decides.
template <class Done>
bool poll_for(std::chrono::microseconds limit, Done done) {
  constexpr std::chrono::microseconds kPause{50};
  const auto start = std::chrono::steady_clock::now();
  for (bool pause = true;;) {
    for (int i = 0; i < 64; ++i) {  // the clock is read once every 64 polls
      if (done()) return true;
      if (pause)
        cpu_relax();
      else
        std::this_thread::yield();
    }
    const auto waited = std::chrono::steady_clock::now() - start;
    if (waited >= limit) return done();
    pause = waited < kPause;
  }
}

// Sets the thread count of OpenBLAS and of the pool (at least 1).
void cpu_set_threads(int n);
int cpu_threads();

// While it lives, the count is this machine's share for one of `ranks`
// ranks computing at once: max(1, min(count before, cores / ranks)), never
// more than before (OPENBLAS_NUM_THREADS is respected). Restores the count
// before when it goes.
class CpuShareScope {
 public:
  explicit CpuShareScope(int ranks);
  ~CpuShareScope();
  CpuShareScope(const CpuShareScope&) = delete;
  CpuShareScope& operator=(const CpuShareScope&) = delete;

 private:
  int saved_;
};

// A non-owning reference to a callable taking a task number: a lambda
// passed to parallel_for is neither copied nor allocated (the forward
// matmul calls it for every layer). Valid while the callable lives, which
// for a temporary argument is the whole parallel_for call.
class TaskFn {
 public:
  template <class F>
    requires(!std::same_as<std::remove_cvref_t<F>, TaskFn> && std::invocable<F&, int64_t>)
  TaskFn(F&& f)  // implicit: parallel_for(n, [&](int64_t t) { ... })
      : callable_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* callable, int64_t t) { (*static_cast<std::remove_reference_t<F>*>(callable))(t); }) {}
  void operator()(int64_t t) const { call_(callable_, t); }

 private:
  void* callable_;
  void (*call_)(void* callable, int64_t t);
};

// Runs fn(t) for every t in [0, tasks) and returns when all are done, on up
// to cpu_threads() threads (the caller is one of them). A single task, or a
// call made while another caller holds the pool (two rank threads, or a task
// that calls back in), runs on the calling thread.
void parallel_for(int64_t tasks, TaskFn fn);

// A non-owning reference to a callable taking a range [begin, end).
class RangeFn {
 public:
  template <class F>
    requires(!std::same_as<std::remove_cvref_t<F>, RangeFn> && std::invocable<F&, int64_t, int64_t>)
  RangeFn(F&& f)
      : callable_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* callable, int64_t b, int64_t e) { (*static_cast<std::remove_reference_t<F>*>(callable))(b, e); }) {}
  void operator()(int64_t b, int64_t e) const { call_(callable_, b, e); }

 private:
  void* callable_;
  void (*call_)(void* callable, int64_t b, int64_t e);
};

// Runs fn over [0, items) cut into contiguous ranges, for loops whose items
// are independent (each writes its own outputs): a range per thread, or one
// range on the calling thread where the work (items x cost_per_item, in
// elements touched) is too small to pay for waking a thread.
void parallel_for_ranges(int64_t items, int64_t cost_per_item, RangeFn fn);

}  // namespace vqddp
