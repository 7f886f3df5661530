// Communicator: the one interface through which vq/ and train/ talk to other
// ranks. Every call is a collective: EVERY rank of the group must make the
// same calls in the same order with matching arguments, or the backend
// throws (DesyncError, TimeoutError) instead of hanging or silently mixing
// data. Every call works IN PLACE on the tensors the caller passes: results
// land in the caller's storage, never in a temporary (VQ_SEMANTICS.md
// invariant 5; vector-quantize-pytorch #101 reduced a .contiguous() copy).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/errors.h"
#include "engine/tensor.h"

namespace vqddp {

enum class ReduceOp : uint8_t { sum, avg, max, min };
const char* reduce_op_name(ReduceOp op);

// Per-communicator statistics, so tests can assert that a path issues no
// collective and logs can report traffic. `bytes` counts the payload each
// call touches on this rank: the tensor for all_reduce and broadcast, the
// gathered output for all_gather; a barrier moves 0 bytes.
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

  // Every rank must call. In place: `t` holds the reduction of all ranks'
  // `t` afterwards, bitwise identical on every rank. float32, float64 and
  // int64; avg (sum / W) is for float tensors only.
  virtual void all_reduce(Tensor& t, ReduceOp op) = 0;

  // Every rank must call, with the same root and shape. In place: `t` holds
  // root's values afterwards.
  virtual void broadcast(Tensor& t, int root) = 0;

  // Every rank must call, with inputs of equal shape [n, ...]. Writes into
  // `out` [W * n, ...], which the caller allocates: rank r's rows at
  // [r * n, (r + 1) * n).
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;

  // Every rank must call, with the same `counts` (rows per rank, length W;
  // typically from an all_gather of the row counts). Rank r passes
  // in [counts[r], ...]; ranks with 0 rows take part. Writes into `out`
  // [sum(counts), ...], ranks' rows concatenated in rank order.
  virtual void all_gather_rows(const Tensor& in, const std::vector<int64_t>& counts, Tensor& out) = 0;

  // Every rank must call. Returns once all ranks have arrived.
  virtual void barrier() = 0;

  // The sum of exact data parallelism (engine/exact_batch.h). Every rank
  // must call, with the same `counts` (units per rank, length W). Rank r
  // passes its units' float32 partials [counts[r], n]. Writes into `out` [n]
  // the sum of all units' rows taken in global unit order (rank 0's units
  // first), accumulated in double and rounded to float32 once: the same bits
  // on every rank and for any split of the same rows over any number of
  // ranks. This default gathers every row to every rank (all_gather_rows)
  // and adds them there; the thread backend reads the rows in place.
  virtual void reduce_units(const Tensor& in, const std::vector<int64_t>& counts, Tensor& out);

  const CommCounters& counters() const { return counters_; }

 protected:
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
  void check_reduce_units(const Tensor& in, const std::vector<int64_t>& counts, const Tensor& out) const;

 private:
  CommCounters counters_;
};

// Allocating forms for callers that do not keep an output buffer.
Tensor all_gather(Communicator& comm, const Tensor& in);
Tensor all_gather_rows(Communicator& comm, const Tensor& in, const std::vector<int64_t>& counts);
// Every rank's row count: one all_gather of a single int64.
std::vector<int64_t> all_gather_counts(Communicator& comm, int64_t rows);

}  // namespace vqddp
