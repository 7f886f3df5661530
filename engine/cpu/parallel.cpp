#include "engine/cpu/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/cpu/blas.h"

namespace vqddp {

namespace {

// How long the pool's waits poll (poll_for) before they sleep.
constexpr std::chrono::microseconds kSpin{1000};

// Workers wait for a job, take task numbers from a shared counter and
// report when the job's last task is done. One job at a time: `busy` is
// taken with try_lock by the caller, so a second caller never waits for
// the first, it computes alone.
//
// Waiting polls before it sleeps, on both sides: a training step is
// hundreds of jobs of some 10-100 µs, and a condition variable's wake-up
// (a futex call, a reschedule; more in a VM, whose idle core must be woken
// too) costs about as much as the job. A worker thus polls for the next
// job for kSpin after each one, and the caller polls for its helpers' end.
// kSpin covers the gaps between a step's jobs, which the single-threaded
// ops between them (autograd, small tensors) make longer than 50 µs: the
// main job at --world 1 on 2 cores ran 1.07-1.15x as fast with 1 ms as
// with the 50 µs before (issue 62). The pool runs only when a rank has
// more than one core to itself (cpu_threads() > 1), so the polling thread
// never takes a core another rank needs.
class Pool {
 public:
  ~Pool() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }

  // threads > 1 and tasks > 1.
  void run(int threads, int64_t tasks, const TaskFn& fn) {
    std::unique_lock busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) {
      for (int64_t t = 0; t < tasks; ++t) fn(t);
      return;
    }
    int helpers = static_cast<int>(std::min<int64_t>(threads, tasks)) - 1;
    {
      std::lock_guard lock(mu_);
      while (static_cast<int>(workers_.size()) < helpers) workers_.emplace_back([this] { work(); });
      fn_ = &fn;
      tasks_ = tasks;
      next_.store(0);
      active_.store(helpers);
      wanted_ = helpers;
      error_ = nullptr;
      job_.fetch_add(1);
    }
    wake_.notify_all();
    take_tasks();
    poll_for(kSpin, [&] { return active_.load() == 0; });
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return active_.load() == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void take_tasks() {
    for (int64_t t; (t = next_.fetch_add(1)) < tasks_;) {
      try {
        (*fn_)(t);
      } catch (...) {
        std::lock_guard lock(mu_);
        if (!error_) error_ = std::current_exception();
      }
    }
  }

  void work() {
    uint64_t seen = 0;
    std::unique_lock lock(mu_);
    for (;;) {
      if (!stop_ && job_.load() == seen) {
        lock.unlock();
        poll_for(kSpin, [&] { return job_.load() != seen; });
        lock.lock();
      }
      wake_.wait(lock, [&] { return stop_ || (job_.load() != seen && wanted_ > 0); });
      if (stop_) return;
      seen = job_.load();
      --wanted_;
      lock.unlock();
      take_tasks();
      lock.lock();
      if (active_.fetch_sub(1) == 1) done_.notify_one();
    }
  }

  std::mutex busy_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  const TaskFn* fn_ = nullptr;
  int64_t tasks_ = 0;
  std::atomic<int64_t> next_{0};
  std::atomic<int> active_{0};  // helpers still working on the job
  int wanted_ = 0;
  std::atomic<uint64_t> job_{0};
  bool stop_ = false;
  std::exception_ptr error_;
};

Pool& pool() {
  static Pool p;
  return p;
}

// Starts as OpenBLAS's own count (OPENBLAS_NUM_THREADS, or the cores).
std::atomic<int>& thread_count() {
  static std::atomic<int> n{std::max(1, blas_threads())};
  return n;
}

}  // namespace

void cpu_set_threads(int n) {
  n = std::max(1, n);
  blas_set_threads(n);
  thread_count().store(n);
}

int cpu_threads() { return thread_count().load(); }

CpuShareScope::CpuShareScope(int ranks) : saved_(cpu_threads()) {
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_threads(std::min(saved_, cores / std::max(1, ranks)));
}

CpuShareScope::~CpuShareScope() { cpu_set_threads(saved_); }

void parallel_for(int64_t tasks, TaskFn fn) {
  int threads = cpu_threads();
  if (threads <= 1 || tasks <= 1) {
    for (int64_t t = 0; t < tasks; ++t) fn(t);
    return;
  }
  pool().run(threads, tasks, fn);
}

void parallel_for_ranges(int64_t items, int64_t cost_per_item, RangeFn fn) {
  // About 16K elements a range: a memory-bound loop over that many takes
  // some 5 µs, above the hand-off to a helper that polls (Pool), which a
  // step's helper is for all but its first job. 64K before: the main job
  // at --world 1 ran 1.05-1.12x as fast with 16K (4 pairs), about as fast
  // as with 4K.
  constexpr int64_t kMinCost = 1 << 14;
  int64_t threads = cpu_threads();
  int64_t ranges = std::min<int64_t>(threads, items * std::max<int64_t>(cost_per_item, 1) / kMinCost);
  ranges = std::min(ranges, items);
  if (ranges <= 1) {
    if (items > 0) fn(0, items);
    return;
  }
  parallel_for(ranges, [&](int64_t r) { fn(items * r / ranges, items * (r + 1) / ranges); });
}

}  // namespace vqddp
