// Communicator: the one interface through which vq/ and train/ talk to other
// ranks. Every call is a collective: EVERY rank of the group must make the
// same calls in the same order with matching arguments, or the backend
// throws (DesyncError, TimeoutError) instead of hanging or silently mixing
// data. Every call works IN PLACE on the tensors the caller passes: results
// land in the caller's storage, never in a temporary (docs/design.md
// invariant 5; vector-quantize-pytorch #101 reduced a .contiguous() copy).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "comm/errors.h"
#include "comm/fingerprint.h"
#include "engine/core/tensor.h"

namespace vqddp {

enum class ReduceOp : uint8_t { sum, avg, max, min };
const char* reduce_op_name(ReduceOp op);

// Per-communicator statistics, so tests can assert that a path issues no
// collective and logs can report traffic. `bytes` counts the payload each
// call touches on this rank: the tensor for all_reduce and broadcast, the
// gathered output for all_gather and all_gather_rows; a barrier moves 0
// bytes; reduce_units counts what its transport moves (do_reduce_units).
struct CommCounters {
  uint64_t collectives = 0;
  uint64_t bytes = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend() const = 0;  // "single", "thread", "nccl", "mpi"
  // Where this rank's tensors should live for the cheapest collectives: the
  // host for "single", "thread" and "mpi" (which take any device, staging
  // GPU tensors through the host), the rank's own GPU (cuda:LOCAL_RANK) for
  // "nccl" (which stages host tensors through that GPU).
  virtual Device device() const { return Device::cpu(); }

  // The collectives. They are not virtual: each runs the argument checks
  // every backend shares, builds the call's fingerprint (comm/fingerprint.h)
  // once, hands both to the backend's transport (do_* below) and counts the
  // call (reduce_units leaves its count to the transport), so the backends
  // agree on what a call is by construction and implement only how its
  // data moves.

  // Every rank must call. In place: `t` holds the reduction of all ranks'
  // `t` afterwards, bitwise identical on every rank. float32, float64 and
  // int64; avg (sum / W) is for float tensors only.
  void all_reduce(Tensor& t, ReduceOp op);

  // Every rank must call, with the same root and shape. In place: `t` holds
  // root's values afterwards.
  void broadcast(Tensor& t, int root);

  // Every rank must call, with inputs of equal shape [n, ...]. Writes into
  // `out` [W * n, ...], which the caller allocates: rank r's rows at
  // [r * n, (r + 1) * n).
  void all_gather(const Tensor& in, Tensor& out);

  // Every rank must call, with the same `counts` (rows per rank, length W;
  // typically from an all_gather of the row counts). Rank r passes
  // in [counts[r], ...]; ranks with 0 rows take part. Writes into `out`
  // [sum(counts), ...], ranks' rows concatenated in rank order.
  void all_gather_rows(const Tensor& in, const std::vector<int64_t>& counts, Tensor& out);

  // Every rank must call. Returns once all ranks have arrived.
  void barrier();

  // The sum of exact data parallelism (engine/exact_batch.h). Every rank
  // must call, with the same `counts` (units per rank, length W). Rank r
  // passes its units' float32 partials [counts[r], n]. Writes into `out` [n]
  // the sum of all units' rows taken in global unit order (rank 0's units
  // first), accumulated in double and rounded to float32 once: the same bits
  // on every rank and for any split of the same rows over any number of
  // ranks. The default transport (do_reduce_units) gathers every row to
  // every rank (all_gather_rows) and adds them there; the thread backend
  // reads the rows in place.
  void reduce_units(const Tensor& in, const std::vector<int64_t>& counts, Tensor& out);
  // The same on partials held as column blocks: blocks[i] [counts[rank],
  // n_i] (the same n_i on every rank) and out [sum of n_i], the bits of
  // reduce_units on their concatenation along dimension 1, which is made
  // only where the transport needs one buffer (the default: one copy on
  // the device). A world of one adds each block's units where they are
  // (DeviceKernels::unit_sums: no copy, no transfer, no host sync), and the
  // thread backend reads every rank's blocks in place.
  void reduce_units(const std::vector<Tensor>& blocks, const std::vector<int64_t>& counts, Tensor& out);

  const CommCounters& counters() const { return counters_; }

 protected:
  // The backends' transport, called by the collective of the same name once
  // its arguments passed the checks, with the call's fingerprint `fp`. A
  // backend keeps its per-call machinery here (sequence numbers, deadlines,
  // staging through the host or its GPU: a staged call runs the same do_*
  // again on the copies, with the same `fp`) and uses `fp` as it needs: the
  // thread backend compares every rank's in each rendezvous, MPI and NCCL
  // only with their collective check on (fingerprint_mismatch), and all
  // three name the call by it in timeout and failure messages. The
  // collective counts the call once do_* returns (count()), so do_* must
  // not, except do_reduce_units (see there).
  virtual void do_all_reduce(Tensor& t, ReduceOp op, const Fingerprint& fp) = 0;
  virtual void do_broadcast(Tensor& t, int root, const Fingerprint& fp) = 0;
  virtual void do_all_gather(const Tensor& in, Tensor& out, const Fingerprint& fp) = 0;
  virtual void do_all_gather_rows(const Tensor& in, const std::vector<int64_t>& counts, Tensor& out,
                                  const Fingerprint& fp) = 0;
  virtual void do_barrier(const Fingerprint& fp) = 0;
  // The default gathers the rows with all_gather_rows (a collective of its
  // own, with its own fingerprint and count; `fp` is unused) and adds them
  // on every rank. Unlike the other do_*, this one counts itself: the
  // default's traffic is its all_gather_rows, a backend's own transport
  // counts what it moves (the thread backend: the partials it reads).
  virtual void do_reduce_units(const Tensor& in, const std::vector<int64_t>& counts, Tensor& out,
                               const Fingerprint& fp);
  // reduce_units of several blocks in a world of more than one; counts
  // itself like do_reduce_units. The default concatenates them (one
  // copy_blocks launch) for do_reduce_units; a single block goes as it is.
  virtual void do_reduce_unit_blocks(const std::vector<Tensor>& blocks, const std::vector<int64_t>& counts,
                                     Tensor& out, const Fingerprint& fp);

  void count(uint64_t bytes) {
    ++counters_.collectives;
    counters_.bytes += bytes;
  }
  // Elements per row (dimension 0) of an all_gather_rows input.
  static int64_t row_numel(const Tensor& in) { return shape_numel(Shape(in.shape().begin() + 1, in.shape().end())); }
  // Argument checks every backend shares; `op` names the call in messages.
  void check_all_reduce(const Tensor& t, ReduceOp op) const;
  void check_broadcast(const Tensor& t, int root) const;
  void check_all_gather(const Tensor& in, const Tensor& out) const;
  void check_all_gather_rows(const Tensor& in, const std::vector<int64_t>& counts, const Tensor& out) const;
  void check_reduce_units(const std::vector<Tensor>& blocks, const std::vector<int64_t>& counts,
                          const Tensor& out) const;

  // The comparison half of the collective check of backends whose ranks
  // live in different processes (MPI, NCCL): they gather every rank's
  // encode_fingerprint(fp, seq) words in rank order (`all_words`,
  // W * kFingerprintWords, by their own transport), and this compares each
  // rank's with `mine`'s. Returns "" when all agree, else the desync
  // message naming every rank's call (desync_message), which the backend
  // raises as a DesyncError prefixed with its name and rank. Every rank
  // gathered the same words, so every rank finds the same answer.
  std::string fingerprint_mismatch(const Fingerprint& mine, uint64_t seq, std::span<const int64_t> all_words) const;

 private:
  CommCounters counters_;
};

// Allocating forms for callers that do not keep an output buffer.
Tensor all_gather(Communicator& comm, const Tensor& in);
Tensor all_gather_rows(Communicator& comm, const Tensor& in, const std::vector<int64_t>& counts);
// Every rank's row count: one all_gather of a single int64; in a graphed
// step's replay, the capture's counts, recalled without a collective
// (engine/step_graph.h: graph_recall_counts). A collective of host tensors
// is refused in a graphed step.
std::vector<int64_t> all_gather_counts(Communicator& comm, int64_t rows);
// This rank's first row in the global batch (the lower ranks' rows come
// first), from one all_gather_counts: where a draw keyed by global row
// starts on this rank.
int64_t first_global_row(Communicator& comm, int64_t rows);

}  // namespace vqddp
