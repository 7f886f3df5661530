#include "comm/single.h"

namespace vqddp {

// Communicator's collectives never call these in a world of one (they do
// its work themselves, on every backend); they are here for the interface.
// The reduction of one value is the value (avg divides by W = 1).
void SingleCommunicator::do_all_reduce(Tensor&, ReduceOp, const Fingerprint&) {}

void SingleCommunicator::do_broadcast(Tensor&, int, const Fingerprint&) {}

void SingleCommunicator::do_all_gather(const Tensor& in, Tensor& out, const Fingerprint&) { out.copy_(in); }

void SingleCommunicator::do_all_gather_rows(const Tensor& in, const std::vector<int64_t>&, Tensor& out,
                                            const Fingerprint&) {
  out.copy_(in);
}

void SingleCommunicator::do_barrier(const Fingerprint&) {}

}  // namespace vqddp
