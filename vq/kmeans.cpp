#include "vq/kmeans.h"

#include "engine/autograd.h"
#include "vq/assign.h"
#include "vq/code_stats.h"
#include "vq/sampler.h"

namespace vqddp {

void kmeans_update(Tensor& means, const Tensor& stats, bool cosine) {
  int64_t k = means.size(0), d = means.size(1);
  const double* counts = stats_counts(stats, k).data<double>();
  const double* sums = stats_sums(stats, k, d).data<double>();
  float* pm = means.data<float>();
  for (int64_t c = 0; c < k; ++c) {
    if (counts[c] == 0) continue;  // an empty cluster keeps its mean
    for (int64_t j = 0; j < d; ++j) pm[c * d + j] = static_cast<float>(sums[c * d + j] / counts[c]);
  }
  if (cosine) means.copy_(l2_normalize_rows(means));
  means.bump_version();
}

KmeansResult kmeans(const Tensor& x, int64_t k, int iters, bool cosine, Communicator& comm, Generator& shared) {
  VQDDP_CHECK(iters >= 1, "kmeans: iters {} must be at least 1", iters);
  NoGradGuard no_grad;
  Tensor means = sample_rows(x, k, comm, shared);  // (K, D) or (0, D)
  if (means.size(0) == 0) return {};
  Tensor stats;
  for (int it = 0; it < iters; ++it) {
    stats = code_stats(x, assign_codes(x, means, cosine), k);  // (K + K*D)
    comm.all_reduce(stats, ReduceOp::sum);
    kmeans_update(means, stats, cosine);
  }
  // bins: the counts of the last assignment (before its means update).
  Tensor bins = empty({k});
  const double* counts = stats_counts(stats, k).data<double>();
  for (int64_t c = 0; c < k; ++c) bins.data<float>()[c] = static_cast<float>(counts[c]);
  return {means, bins};
}

}  // namespace vqddp
