#include "vq/kmeans.h"

#include "engine/autograd.h"
#include "engine/ops.h"
#include "vq/assign.h"
#include "vq/code_stats.h"
#include "vq/sampler.h"
#include "vq/kernels/vq_kernels.h"

namespace vqddp {

KmeansResult kmeans(const Tensor& x, int64_t k, int iters, bool cosine, Communicator& comm, Generator& shared) {
  VQDDP_CHECK(iters >= 1, "kmeans: iters {} must be at least 1", iters);
  NoGradGuard no_grad;
  Tensor means = sample_rows(x, k, comm, shared);  // (K, D) or (0, D), on x's device
  if (means.size(0) == 0) return {};
  const StatsLayout layout{k, x.size(1), comm.world_size(), x.size(1)};
  VqKernels& vq = vq_kernels(x.device());
  Tensor bins = empty({k}, DType::f32, x.device());
  // Exact sums whatever the split or the ranks' order (code_stats.h).
  const Tensor grid = grid_scale({x}, &comm);
  for (int it = 0; it < iters; ++it) {
    Tensor stats = code_stats(x, assign_codes(x, means, cosine), layout, comm.rank(), grid);
    comm.all_reduce(stats, ReduceOp::sum);
    // A non-finite row must not become a centroid: the flags of the first
    // iteration (every rank's, all-reduced) are read once, before anything
    // reaches the codebook. The one read of k-means init, a step that runs
    // once per codebook.
    if (it == 0) check_nonfinite_flags(stats, layout);
    vq.kmeans_update(stats, layout, means, bins);  // bins: the counts of the last assignment
    if (cosine) means = l2_normalize_rows(means);
  }
  return {means, bins};
}

}  // namespace vqddp
