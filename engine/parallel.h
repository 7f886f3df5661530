// The engine's CPU threads: one process-wide count shared by OpenBLAS (the
// backward GEMMs) and by our own kernels (engine/cpu/), and a small pool
// that runs our kernels' tasks.
//
// Rank threads that compute concurrently each want one thread, so
// run_ranks sets the count with cpu_set_threads() and restores it after.
// Our kernels' results never depend on how their tasks are spread over
// threads (each task owns whole output elements), so the count, and whether
// the pool was free, change speed only, never bits.
#pragma once

#include <cstdint>
#include <functional>

namespace vqddp {

// Sets the thread count of OpenBLAS and of the pool (at least 1).
void cpu_set_threads(int n);
int cpu_threads();

// Runs fn(t) for every t in [0, tasks) and returns when all are done, on up
// to cpu_threads() threads (the caller is one of them). A call made while
// another caller holds the pool (two rank threads, or a task that calls
// back in) runs all its tasks on the calling thread.
void parallel_for(int64_t tasks, const std::function<void(int64_t)>& fn);

}  // namespace vqddp
