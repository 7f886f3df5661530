// Running a collective on copies when the caller's tensors are not where the
// backend works: the thread backend reduces in host memory (GPU tensors are
// staged through the host), NCCL reduces in the rank's GPU (host tensors are
// staged through it). Either way the result lands in the caller's `out`
// (in place, docs/design.md invariant 5) and the caller never sees the
// copies.
// Internal header: not installed with the library (the backends' device staging).
#pragma once

#include "engine/core/tensor.h"
#include "engine/device.h"
#include "engine/device_counters.h"
#include "engine/step_graph.h"

namespace vqddp {

// When `in` and `out` are both on `home`, returns false and does nothing.
// Otherwise runs collective(in_home, out_home) on copies on `home` and
// copies the result back into `out`, returning true. `in` may be `out`
// itself (all_reduce, broadcast: the collective gets the same copy twice and
// works in place on it) or a part of it (an in-place all_gather's rows: it
// is copied on its own, as the copy of `out` holds it elsewhere).
template <class F>
bool staged_on(Device home, const Tensor& in, Tensor& out, F collective) {
  if (in.device() == home && out.device() == home) return false;
  // The copies count as the backend's staging (device_counters.h), apart
  // from the step's own transfers.
  CollectiveStagingScope staging;
  auto at_home = [&](const Tensor& t) { return t.device() == home ? t : empty(t.shape(), t.dtype(), home).copy_(t); };
  bool same = in.shares_storage(out) && in.raw_ptr() == out.raw_ptr() && in.shape() == out.shape();
  Tensor h = at_home(out);
  collective(same ? h : at_home(in), h);
  if (!out.shares_storage(h)) out.copy_(h);
  return true;
}

// The host backends' form (thread, mpi): they reduce in host memory, and
// tensors on a device go through the host.
template <class F>
bool staged_on_host(const Tensor& in, Tensor& out, F collective) {
  return staged_on(Device::cpu(), in, out, collective);
}

// A collective of a graphed step on sim (engine/step_graph.h): a launch of
// the step, run with the rest of its launches (at the step's end, or as its
// replay) on the device buffers themselves (sim memory is host memory).
// Every rank's replay runs the same launches in the same order, so the
// collectives inside meet as the issued ones do, with the same arithmetic:
// a device collective, as NCCL's kernels are on a GPU. The host backends
// (thread, mpi) take this path; a GPU's thread ranks have no such kernel yet
// (their collectives are staged through the host, which a graph refuses),
// so only sim does.
inline bool in_graphed_sim_step(const Tensor& t) {
  return t.device().kind == Device::Kind::sim && graph_in_step_of(&device_kernels(t.device()));
}

// Hands `work(in, out)` (raw buffers) to the step graph through the kernel
// tables' own interposer (issue_launch), with the signature of `in`, `out`
// and `args`, which must be every other argument the work reads; false
// (nothing done) outside a graphed step on sim.
template <class Work, class... Args>
bool launched_in_graphed_step(const char* kernel, const Tensor& in, const Tensor& out, const Work& work,
                              const Args&... args) {
  if (!in_graphed_sim_step(out) || in.device() != out.device()) return false;
  issue_launch(&device_kernels(out.device()), kernel, [work, i = in.raw_ptr(), o = out.raw_ptr()] { work(i, o); }, in,
               out, args...);
  return true;
}

}  // namespace vqddp
