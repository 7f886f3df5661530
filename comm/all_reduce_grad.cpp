#include "comm/all_reduce_grad.h"

#include "engine/autograd.h"

namespace vqddp {

Tensor all_reduce_sum_grad(const Tensor& x, Communicator& comm) {
  Tensor out = x.detach().clone();
  comm.all_reduce(out, ReduceOp::sum);
  Communicator* c = &comm;
  return record_op("all_reduce_sum", out, {x}, [c](const Tensor& g) -> std::vector<Tensor> {
    Tensor summed = g.clone();
    c->all_reduce(summed, ReduceOp::sum);
    return {summed};
  });
}

}  // namespace vqddp
