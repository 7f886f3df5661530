#include "comm/communicator.h"

#include "comm/rank_order.h"
#include "engine/device.h"
#include "engine/ops.h"
#include "engine/op_profile.h"
#include "engine/step_graph.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

namespace vqddp {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

void Communicator::check_all_reduce(const Tensor& t, ReduceOp op) const {
  VQDDP_CHECK(t.defined(), "rank {}: all_reduce of an undefined tensor", rank());
  VQDDP_CHECK(op != ReduceOp::avg || t.dtype() != DType::i64, "rank {}: all_reduce(avg) needs a float tensor, got {}",
              rank(), t.desc());
}

void Communicator::check_broadcast(const Tensor& t, int root) const {
  VQDDP_CHECK(t.defined(), "rank {}: broadcast of an undefined tensor", rank());
  VQDDP_CHECK(root >= 0 && root < world_size(), "rank {}: broadcast root {} outside world of {}", rank(), root,
              world_size());
}

static Shape with_rows(const Tensor& t, int64_t rows) {
  Shape s = t.shape();
  s[0] = rows;
  return s;
}

void Communicator::check_all_gather(const Tensor& in, const Tensor& out) const {
  VQDDP_CHECK(in.defined() && out.defined(), "rank {}: all_gather of an undefined tensor", rank());
  VQDDP_CHECK(in.dim() >= 1, "rank {}: all_gather needs at least one dimension, got {}", rank(), in.desc());
  VQDDP_CHECK(out.dtype() == in.dtype() && out.shape() == with_rows(in, in.size(0) * world_size()),
              "rank {}: all_gather output is {}, expected {}{} for input {}", rank(), out.desc(),
              dtype_name(in.dtype()), shape_str(with_rows(in, in.size(0) * world_size())), in.desc());
}

void Communicator::check_all_gather_rows(const Tensor& in, const std::vector<int64_t>& counts, const Tensor& out) const {
  VQDDP_CHECK(in.defined() && out.defined(), "rank {}: all_gather_rows of an undefined tensor", rank());
  VQDDP_CHECK(in.dim() >= 1, "rank {}: all_gather_rows needs at least one dimension, got {}", rank(), in.desc());
  VQDDP_CHECK(static_cast<int>(counts.size()) == world_size(), "rank {}: all_gather_rows got {} counts for a world of {}",
              rank(), counts.size(), world_size());
  for (size_t q = 0; q < counts.size(); ++q)
    VQDDP_CHECK(counts[q] >= 0, "rank {}: all_gather_rows counts[{}] = {} is negative", rank(), q, counts[q]);
  VQDDP_CHECK(counts[rank()] == in.size(0), "rank {}: all_gather_rows counts[{}] = {} but the input has {} rows", rank(),
              rank(), counts[rank()], in.size(0));
  int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  VQDDP_CHECK(out.dtype() == in.dtype() && out.shape() == with_rows(in, total),
              "rank {}: all_gather_rows output is {}, expected {}{}", rank(), out.desc(), dtype_name(in.dtype()),
              shape_str(with_rows(in, total)));
}

Tensor all_gather(Communicator& comm, const Tensor& in) {
  VQDDP_CHECK(in.dim() >= 1, "rank {}: all_gather needs at least one dimension, got {}", comm.rank(), in.desc());
  Tensor out = empty(with_rows(in, in.size(0) * comm.world_size()), in.dtype(), in.device());
  comm.all_gather(in, out);
  return out;
}

void Communicator::check_reduce_units(const std::vector<Tensor>& blocks, const std::vector<int64_t>& counts,
                                      const Tensor& out) const {
  VQDDP_CHECK(!blocks.empty() && out.defined() && out.dim() == 1 && out.dtype() == DType::f32,
              "rank {}: reduce_units needs float32 partials [units, n] and an output [n], got {} blocks and {}", rank(),
              blocks.size(), out.defined() ? out.desc() : "none");
  int64_t n = 0;
  for (const Tensor& b : blocks) {
    VQDDP_CHECK(b.defined() && b.dim() == 2 && b.dtype() == DType::f32 && b.device() == out.device() &&
                    b.size(0) == blocks[0].size(0),
                "rank {}: reduce_units needs float32 partials [units, n] on the output's device {}, got {}", rank(),
                out.device().str(), b.defined() ? b.desc() : "none");
    n += b.size(1);
  }
  VQDDP_CHECK(out.size(0) == n, "rank {}: reduce_units of {} columns into an output {}", rank(), n, out.desc());
  VQDDP_CHECK(static_cast<int>(counts.size()) == world_size() && counts[rank()] == blocks[0].size(0),
              "rank {}: reduce_units of {} units with counts for {} ranks ({} here)", rank(), blocks[0].size(0),
              counts.size(), static_cast<int>(counts.size()) > rank() ? counts[rank()] : -1);
}

// The collectives: checks, the fingerprint (the only place a call's is
// built), the backend's transport, the count.

// A collective of host tensors in a graphed step is refused (engine/step_graph.h).
static void check_host_collective(const Communicator& comm, const char* what, const Tensor& t) {
  if (comm.world_size() > 1 && t.device().is_cpu()) graph_check_host_collective(what);
}

void Communicator::all_reduce(Tensor& t, ReduceOp op) {
  check_all_reduce(t, op);
  check_host_collective(*this, "all_reduce", t);
  op_profile_mark("(before a collective)");
  // A world of one, on every backend: the reduction of one value is the
  // value (avg divides by 1), and nothing moves, so nothing is staged
  // through the host (a step graph's step may not read the device).
  if (world_size() > 1)
    do_all_reduce(t, op, Fingerprint(fmt::format("all_reduce({})", reduce_op_name(op)), t.dtype(), t.numel()));
  op_profile_mark("collective: all_reduce");
  count(t.nbytes());
}

void Communicator::broadcast(Tensor& t, int root) {
  check_broadcast(t, root);
  check_host_collective(*this, "broadcast", t);
  op_profile_mark("(before a collective)");
  if (world_size() > 1) do_broadcast(t, root, Fingerprint("broadcast", t.dtype(), t.numel(), root));
  op_profile_mark("collective: broadcast");
  count(t.nbytes());
}

void Communicator::all_gather(const Tensor& in, Tensor& out) {
  check_all_gather(in, out);
  check_host_collective(*this, "all_gather", out);
  op_profile_mark("(before a collective)");
  if (world_size() > 1)
    do_all_gather(in, out, Fingerprint("all_gather", in.dtype(), in.numel()));
  else
    out.copy_(in);
  op_profile_mark("collective: all_gather");
  count(out.nbytes());
}

void Communicator::all_gather_rows(const Tensor& in, const std::vector<int64_t>& counts, Tensor& out) {
  check_all_gather_rows(in, counts, out);
  check_host_collective(*this, "all_gather_rows", out);
  op_profile_mark("(before a collective)");
  if (world_size() > 1)
    do_all_gather_rows(in, counts, out, Fingerprint("all_gather_rows", in.dtype(), row_numel(in), -1, counts));
  else
    out.copy_(in);
  op_profile_mark("collective: all_gather_rows");
  count(out.nbytes());
}

void Communicator::barrier() {
  if (world_size() > 1) {
    graph_check_host_collective("barrier");
    do_barrier(Fingerprint("barrier", DType::f32, 0));
  }
  count(0);
}

void Communicator::reduce_units(const Tensor& in, const std::vector<int64_t>& counts, Tensor& out) {
  reduce_units(std::vector<Tensor>{in}, counts, out);
}

void Communicator::reduce_units(const std::vector<Tensor>& blocks, const std::vector<int64_t>& counts, Tensor& out) {
  check_reduce_units(blocks, counts, out);
  check_host_collective(*this, "reduce_units", out);
  op_profile_mark("(before a collective)");
  int64_t bytes = 0;
  for (const Tensor& b : blocks) bytes += static_cast<int64_t>(b.nbytes());
  if (world_size() == 1) {
    // Nothing to move: each block's units added where they are, in order.
    std::vector<UnitSumBlock> sums;
    int64_t at = 0;
    for (const Tensor& b : blocks) {
      sums.push_back({static_cast<const float*>(b.raw_ptr()), static_cast<float*>(out.raw_ptr()) + at, b.size(0),
                      b.size(1)});
      at += b.size(1);
    }
    device_kernels(out.device()).unit_sums(sums.data(), static_cast<int64_t>(sums.size()));
    out.bump_version();
    count(static_cast<uint64_t>(bytes));
  } else {
    // The block count in the name: the thread backend reads every rank's
    // blocks by position, so ranks that split the columns differently
    // fail the fingerprint check instead.
    std::string kind = blocks.size() == 1 ? "reduce_units" : fmt::format("reduce_units({} blocks)", blocks.size());
    do_reduce_unit_blocks(blocks, counts, out, Fingerprint(kind, DType::f32, out.size(0), -1, counts));
  }
  op_profile_mark("collective: reduce_units");
}

void Communicator::do_reduce_unit_blocks(const std::vector<Tensor>& blocks, const std::vector<int64_t>& counts,
                                         Tensor& out, const Fingerprint& fp) {
  do_reduce_units(blocks.size() == 1 ? blocks[0] : concat(blocks, 1), counts, out, fp);
}

void Communicator::do_reduce_units(const Tensor& in, const std::vector<int64_t>& counts, Tensor& out,
                                   const Fingerprint&) {
  Tensor rows = vqddp::all_gather_rows(*this, in, counts);  // (units, n), global unit order
  // The unit-sum kernel, on the host and on every device: one ascending
  // double sum per column whatever the number of units. Not the engine's
  // sum(rows, 0): on CUDA a reduction of more than 64 rows runs a strided
  // block and a tree, so N GPUs would equal 1 GPU (whose reduce_units runs
  // this same kernel) only while a batch had at most 64 units.
  const UnitSumBlock all{static_cast<const float*>(rows.raw_ptr()), static_cast<float*>(out.raw_ptr()), rows.size(0),
                         in.size(1)};
  device_kernels(out.device()).unit_sums(&all, 1);
  out.bump_version();
}

std::string Communicator::fingerprint_mismatch(const Fingerprint& mine, uint64_t seq,
                                               std::span<const int64_t> all_words) const {
  VQDDP_CHECK(all_words.size() == static_cast<size_t>(world_size()) * kFingerprintWords,
              "rank {}: {} fingerprint words gathered for a world of {}", rank(), all_words.size(), world_size());
  const FingerprintWords words = encode_fingerprint(mine, seq);
  std::vector<std::string> each;
  bool same = true;
  for (int r = 0; r < world_size(); ++r) {
    FingerprintWords w;
    std::copy_n(all_words.begin() + static_cast<size_t>(r) * kFingerprintWords, kFingerprintWords, w.begin());
    same &= w == words;
    each.push_back(describe_fingerprint(w));
  }
  return same ? std::string() : desync_message(seq, each);
}

Tensor all_gather_rows(Communicator& comm, const Tensor& in, const std::vector<int64_t>& counts) {
  VQDDP_CHECK(in.dim() >= 1, "rank {}: all_gather_rows needs at least one dimension, got {}", comm.rank(), in.desc());
  Tensor out = empty(with_rows(in, std::accumulate(counts.begin(), counts.end(), int64_t{0})), in.dtype(), in.device());
  comm.all_gather_rows(in, counts, out);
  return out;
}

// In a graphed step the capture's counts, recalled (engine/step_graph.h):
// a replay runs no host collective.
std::vector<int64_t> all_gather_counts(Communicator& comm, int64_t rows) {
  return graph_recall_counts(
      rows, [&] { return all_gather(comm, from_vector(std::vector<int64_t>{rows}, {1})).to_vector<int64_t>(); });
}

int64_t first_global_row(Communicator& comm, int64_t rows) {
  std::vector<int64_t> counts = all_gather_counts(comm, rows);
  int64_t first = 0;
  for (int r = 0; r < comm.rank(); ++r) first += counts[r];
  return first;
}

}  // namespace vqddp
