#include "comm/single.h"

namespace vqddp {

// The reduction of one value is the value (avg divides by W = 1).
void SingleCommunicator::all_reduce(Tensor& t, ReduceOp op) {
  check_all_reduce(t, op);
  count(t.nbytes());
}

void SingleCommunicator::broadcast(Tensor& t, int root) {
  check_broadcast(t, root);
  count(t.nbytes());
}

void SingleCommunicator::all_gather(const Tensor& in, Tensor& out) {
  check_all_gather(in, out);
  out.copy_(in);
  count(out.nbytes());
}

void SingleCommunicator::all_gather_rows(const Tensor& in, const std::vector<int64_t>& counts, Tensor& out) {
  check_all_gather_rows(in, counts, out);
  out.copy_(in);
  count(out.nbytes());
}

void SingleCommunicator::barrier() { count(0); }

}  // namespace vqddp
