#include "vq/codebook_affine.h"

#include <cmath>
#include <vector>

#include "engine/autograd.h"
#include "engine/kernel_math.h"
#include "engine/ops.h"
#include "vq/code_stats.h"

namespace vqddp {

namespace {

// v = old * decay + new * (1 - decay), or new the first time.
void ema_or_set(Tensor& value, bool first, const std::vector<float>& fresh, float decay) {
  std::vector<float> v = value.to_vector<float>();
  for (size_t j = 0; j < v.size(); ++j) v[j] = first ? fresh[j] : v[j] * decay + fresh[j] * (1.f - decay);
  value.copy_(from_vector(v, value.shape()).to(value.device()));
}

// Per-dimension mean and biased variance of rows, summed over every rank
// when `comm` is given: the count and sums in one all-reduce, the squared
// deviations from the global mean in a second. Both sums are exact on the
// grid of kernel_math.h (the rows' largest |value| over every rank, one max
// all-reduce; a deviation from the mean is below twice that plus a grid
// step, so its square is below 8 times its square), so no split and no
// order of the ranks changes them.
void moments(const Tensor& rows_in, Communicator* comm, std::vector<float>& mean, std::vector<float>& variance) {
  const Tensor rows = rows_in.detach().to(Device::cpu());
  const int64_t m = rows.size(0), d = rows.size(1);
  const float* p = rows.data<float>();
  const Tensor scale = grid_scale({rows}, comm);
  const double largest = scale.data<double>()[0];
  const double grid = grid_quantum(largest), grid_sq = grid_quantum(8.0 * largest * largest);
  Tensor sums = zeros({d + 1}, DType::f64);
  double* s = sums.data<double>();
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < d; ++j) s[j] += to_grid(p[i * d + j], grid);
  s[d] = static_cast<double>(m);
  if (comm) comm->all_reduce(sums, ReduceOp::sum);
  const double n = std::max(s[d], 1.0);
  Tensor dev = zeros({d}, DType::f64);
  double* q = dev.data<double>();
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < d; ++j) {
      const double c = p[i * d + j] - s[j] / n;
      q[j] += to_grid(c * c, grid_sq);
    }
  if (comm) comm->all_reduce(dev, ReduceOp::sum);
  mean.resize(d);
  variance.resize(d);
  for (int64_t j = 0; j < d; ++j) {
    mean[j] = static_cast<float>(s[j] / n);
    variance[j] = static_cast<float>(q[j] / n);
  }
}

Tensor stdev(const Tensor& variance) { return vqddp::sqrt(clamp(variance, 1e-5f, 3.4e38f)); }

}  // namespace

CodebookAffine::CodebookAffine(int64_t dim, float batch_decay, float codebook_decay)
    : batch_decay_(batch_decay), codebook_decay_(codebook_decay) {
  batch_mean = register_buffer("batch_mean", zeros({dim}));
  batch_variance = register_buffer("batch_variance", ones({dim}), ValueRange::non_negative());
  codebook_mean = register_buffer("codebook_mean", zeros({dim}));
  codebook_variance = register_buffer("codebook_variance", ones({dim}), ValueRange::non_negative());
  batch_needs_init = register_buffer("batch_needs_init", ones({1}, DType::i64), ValueRange{0, 1});
  codebook_needs_init = register_buffer("codebook_needs_init", ones({1}, DType::i64), ValueRange{0, 1});
}

void CodebookAffine::update(const Tensor& x, const Tensor& embed, Communicator& comm) {
  std::vector<float> mean, variance;
  moments(embed, nullptr, mean, variance);  // the codes: the same on every rank
  const bool codebook_first = codebook_needs_init.item<int64_t>() != 0;
  ema_or_set(codebook_mean, codebook_first, mean, codebook_decay_);
  ema_or_set(codebook_variance, codebook_first, variance, codebook_decay_);
  codebook_needs_init.fill_(0);
  moments(x, &comm, mean, variance);
  const bool batch_first = batch_needs_init.item<int64_t>() != 0;
  ema_or_set(batch_mean, batch_first, mean, batch_decay_);
  ema_or_set(batch_variance, batch_first, variance, batch_decay_);
  batch_needs_init.fill_(0);
}

// The statistics are the same on every rank: batch-free constants of a step.
Tensor CodebookAffine::to_batch_space(const Tensor& embed) const {
  return add(mul(sub(embed, mark_batch_free(codebook_mean)),
                 mark_batch_free(div(stdev(batch_variance), stdev(codebook_variance)))),
             mark_batch_free(batch_mean));
}

Tensor CodebookAffine::to_codebook_space(const Tensor& x) const {
  return add(mul(sub(x, mark_batch_free(batch_mean)), mark_batch_free(div(stdev(codebook_variance), stdev(batch_variance)))),
             mark_batch_free(codebook_mean));
}

}  // namespace vqddp
