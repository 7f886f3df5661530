#include "vq/finite_rows.h"

#include "comm/agree.h"
#include "engine/ops.h"
#include "vq/code_stats.h"

namespace vqddp {

void refuse_nonfinite_rows(const Tensor& x, Communicator& comm, const std::string& input) {
  if (!x.device().is_cpu() || x.dtype() != DType::f32) return;
  // 1 + the flat index of this rank's first non-finite element, 0 if none:
  // the flag layout nonfinite_flags_message reads.
  Tensor flags = zeros({comm.world_size()}, DType::f64);
  flags.data<double>()[comm.rank()] = static_cast<double>(first_nonfinite(x) + 1);
  comm.all_reduce(flags, ReduceOp::sum);
  std::string bad = nonfinite_flags_message(flags.data<double>(), comm.world_size(), x.dim() == 2 ? x.size(1) : 1, input);
  if (!bad.empty()) VQDDP_THROW_NONFINITE_EVERY_RANK("{}", bad);
}

}  // namespace vqddp
