#include "comm/single.h"

namespace vqddp {

static uint64_t bytes_of(const Tensor& t) { return t.numel() * dtype_size(t.dtype()); }

// The reduction of one value is the value (avg divides by W = 1).
void SingleCommunicator::all_reduce(Tensor& t, ReduceOp op) {
  check_all_reduce(t, op);
  count(bytes_of(t));
}

void SingleCommunicator::broadcast(Tensor& t, int root) {
  check_broadcast(t, root);
  count(bytes_of(t));
}

void SingleCommunicator::all_gather(const Tensor& in, Tensor& out) {
  check_all_gather(in, out);
  out.copy_(in);
  count(bytes_of(out));
}

void SingleCommunicator::all_gather_rows(const Tensor& in, const std::vector<int64_t>& counts, Tensor& out) {
  check_all_gather_rows(in, counts, out);
  out.copy_(in);
  count(bytes_of(out));
}

void SingleCommunicator::barrier() { count(0); }

}  // namespace vqddp
