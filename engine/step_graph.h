// A training step launched as one captured graph: a CUDA graph on a GPU,
// and on the simulated device the same rules, emulated, so CI proves that a
// step replays without a GPU.
//
// The host code of every step still runs (autograd, the modules' host
// state, the sampler, every upload); only its launches are not issued one by
// one. The first graphed step is captured. Each later one is checked, launch
// for launch, to be the captured step again (the same kernels on the same
// buffers with the same sizes and scalars: a signature of every argument of
// every kernel-table call) and then runs as one replay of the capture. So a
// step may differ from the captured one only in what it uploads, and the
// replay computes what issuing its launches would have, bit for bit.
//
// What makes the same buffers possible, and the replay equal to the step:
//  - Memory: while a graphed step runs, allocations come from the graph's
//    arena. Allocation i of every step is block i (its size checked), and
//    no block serves two allocations of one step. The graph owns its blocks
//    until it is destroyed; a tensor made in a step and still held when the
//    next step runs holds that step's values (read step results before).
//  - Uploads (host -> device copies) are not in the graph. They must go into
//    blocks of the step (an upload into a buffer made before the step is
//    refused: a launch of the step before it would have read the old
//    contents) and are queued as the host code issues them, before the
//    replay (during the capture: held, and queued after it), so they land
//    before the replay reads them.
//  - A read (device -> host) or a wait inside a graphed step is refused:
//    nothing of the step has run yet.
// A launch that differs from the capture's is an error naming the step, the
// launch and both kernels: state carried to the next step in a new tensor
// instead of an in-place write, or a scalar argument that changes from step
// to step (a learning rate: upload it), shows there.
//
// One graph per thread at a time, whatever its device (the check is the
// thread's: a second StepGraph on it is refused). The trainer graphs a world of
// one, and thread or mpi ranks on sim, whose collectives of device tensors
// are launches of the step there (comm/staging.h); elsewhere a collective
// across ranks is host work (train/rank_step.cpp).
#pragma once

#include <bit>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/device.h"

namespace vqddp {

struct GraphSession;

class StepGraph {
 public:
  explicit StepGraph(Device device);  // sim or cuda; others throw
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Around one step's host code, on the thread that runs it. The first step
  // is captured; end_step launches the step (the capture's replay).
  void begin_step(int64_t step);
  // Or around a step that is issued, not captured (its launches issued as
  // they go): the step before the first graphed one, whose row counts
  // (graph_recall_counts below) every later capture then recalls, so that
  // no graphed step, captured or replayed, runs a host collective.
  void begin_issued_step(int64_t step);
  void end_step();
  // A step whose host code threw: its launches are dropped (a capture is
  // ended and discarded; the graph captures again at the next step).
  void abandon_step();

  bool captured() const;
  int64_t launches() const;  // graphed in the last step
  int64_t replays() const;   // steps run wholly as replays of earlier captures
  int64_t graphs() const;    // captured segments (see below)
  // A step that picks among launch sequences on the host (note_step_variant:
  // quantize dropout's layers, a GAN step's kind) is a sequence of
  // segments, split at each choice: the launches before the first choice,
  // then those after each, keyed by the choices made so far. The first
  // segment is captured in the first step; a choice's segment is issued
  // the first time a step makes it (with the step's segments before it run
  // first: its first run may do first-time work, a part's first optimizer
  // step), captured the second time, and replayed in every later step that
  // makes it. So a step of any variant replays once its variant was seen
  // twice. "" while steps are graphed; past 64 keys graphing stops,
  // saying why here.
  const std::string& stopped_because() const;

 private:
  std::unique_ptr<GraphSession> s_;
};

// ---- for the counting wrappers of the kernel tables -------------------------
// (engine/counted_kernels.cpp, vq/kernels/vq_kernels.cpp): every launch of a
// graphed step passes through graph_launch.

// A launch's arguments, hashed: pointers by address, numbers by their bits.
class LaunchSignature {
 public:
  template <class T>
    requires(std::is_integral_v<T> || std::is_enum_v<T>)
  void add(T v) { mix(static_cast<uint64_t>(v)); }
  void add(float v) { mix(std::bit_cast<uint32_t>(v)); }
  void add(double v) { mix(std::bit_cast<uint64_t>(v)); }
  void add(const void* p) { mix(reinterpret_cast<uintptr_t>(p)); }
  uint64_t value() const { return h_; }

 private:
  void mix(uint64_t v) {
    h_ = (h_ ^ v) * 0x100000001b3ull;
    h_ ^= h_ >> 29;
  }
  uint64_t h_ = 0xcbf29ce484222325ull;
};

class Tensor;
// A Tensor's part of a signature: its buffer, dtype and shape (contiguous:
// the shape is the layout), or that it is undefined.
void add_to_signature(LaunchSignature& s, const Tensor& t);

// An argument's part of a launch signature: numbers by their bits, pointers
// by address, a span by its size and elements, a plan or any struct with a
// fields() list (engine/device.h's BroadcastPlan::fields) by its fields.
template <class T>
void add_to_signature(LaunchSignature& s, const T& v) {
  if constexpr (requires { v.fields(); }) {
    std::apply([&s](const auto&... f) { (add_to_signature(s, f), ...); }, v.fields());
  } else if constexpr (requires { v.size(); v.data(); }) {  // a span
    s.add(v.size());
    for (const auto& x : v) add_to_signature(s, x);
  } else if constexpr (std::is_pointer_v<T>) {
    s.add(static_cast<const void*>(v));
  } else {
    static_assert(std::is_arithmetic_v<T> || std::is_enum_v<T>, "a launch argument the signature cannot read");
    s.add(v);
  }
}

// The graph of this thread on the device whose kernel table
// (device_kernels) is `table` while one of its steps runs, else nullptr
// (one thread-local read: the cost of every launch outside graphs). The
// table, not the device: every sim:N shares one.
GraphSession* graph_in_step_of(const DeviceKernels* table);
// A launch of a graphed step: recorded to run at the end of the step (sim),
// run now into the capturing stream (a GPU), or checked against the capture
// and skipped (a replay). What `run` itself calls and allocates (a GPU's VQ
// kernels make scratch tensors) is part of that one launch: not recorded
// apart, and its memory the graph's for as long as the graph lives.
void graph_launch(GraphSession& g, const char* kernel, uint64_t signature, std::function<void()> run);
// Memory of a graphed step (its arena; new blocks from `backend`, the
// table below the counting one), and whether a block released through
// `table` (device_kernels' table) is a graph's to keep: its own, or on sim
// any block freed while a step is captured (the recorded calls, run at the
// step's end, may still read it).
void* graph_alloc(GraphSession& g, size_t bytes, DeviceKernels& backend);
bool graph_release(const DeviceKernels* table, void* p, size_t bytes, DeviceKernels& backend);
// An upload of a graphed step: checked, then issued on `backend` (or held
// until the capture ends).
void graph_upload(GraphSession& g, void* dst, const void* src, size_t bytes, DeviceKernels& backend);
// The one interposer of both kernel tables' counting wrappers
// (engine/counted_kernels.cpp, vq/kernels/vq_kernels.cpp): issues `run`
// (a call of the wrapped table), or, in a graphed step of `table`'s device,
// hands it to the step graph with the signature of `args`, which must be
// every argument the call reads.
template <class Run, class... Args>
void issue_launch(const DeviceKernels* table, const char* kernel, Run&& run, const Args&... args) {
  if (GraphSession* g = graph_in_step_of(table)) [[unlikely]] {
    LaunchSignature s;
    (add_to_signature(s, args), ...);
    graph_launch(*g, kernel, s.value(), std::function<void()>(std::forward<Run>(run)));
    return;
  }
  run();
}

// Names a host-side choice among a step's launch sequences, made before
// the launches it selects and drawn without reading the device (quantize
// dropout's number of layers, from a counter-based stream; a GAN step's
// kind): in a graphed step the next segment is the one keyed by the choices
// so far and this one, so each choice is a graph of its own (StepGraph
// above). Outside a graphed step, nothing.
void note_step_variant(const char* what, int64_t value);
// A read or wait in a graphed step: refused, naming `what`.
[[noreturn]] void graph_refuse_read(GraphSession& g, const char* what);

// ---- host collectives (comm/communicator.cpp) ------------------------------
// A collective of host tensors across ranks is host work that a graph
// cannot hold: NCCL stages host tensors through the GPU (a read, refused
// above), so a step that runs one is not capturable on NCCL ranks, though
// the host backends (thread, mpi) could run it beside the graph. So every
// backend keeps graphed steps free of them, and CI on sim proves the steps
// capturable for NCCL:
//  - the ranks' row counts (all_gather_counts), which size the step's
//    launches, are gathered while a step is issued and, in a replay,
//    recalled from the capture: `gather` is not run, and this rank's count
//    must be the captured one (a replay's allocations are the capture's,
//    so another rank's count changed only fails that rank's own replay,
//    and with it the step on every rank). A capture recalls them from its
//    issued run (a choice's first run, or for the step's first segment the
//    issued step before: begin_issued_step) once the graph has seen an
//    issued step, checked alike; before that (a graph used without one) a
//    capture gathers them;
//  - any other host collective in a graphed step is refused, naming it.
// Outside a graphed step (and in a step's segment issued as it goes), the
// collective runs.
std::vector<int64_t> graph_recall_counts(int64_t mine, const std::function<std::vector<int64_t>()>& gather);
void graph_check_host_collective(const char* what);

}  // namespace vqddp
