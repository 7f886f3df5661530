// Running a collective on copies when the caller's tensors are not where the
// backend works: the thread backend reduces in host memory (GPU tensors are
// staged through the host), NCCL reduces in the rank's GPU (host tensors are
// staged through it). Either way the result lands in the caller's `out`
// (in place, docs/design.md invariant 5) and the caller never sees the
// copies.
// Internal header: not installed with the library (the backends' device staging).
#pragma once

#include "engine/device_counters.h"
#include "engine/core/tensor.h"

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

}  // namespace vqddp
