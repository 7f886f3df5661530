#include "vq/codebook.h"

#include <cmath>
#include <cstring>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/streams.h"
#include "vq/assign.h"
#include "vq/code_stats.h"
#include "vq/device_vq.h"
#include "vq/kmeans.h"
#include "vq/perplexity.h"
#include "vq/sampler.h"

namespace vqddp {

Codebook::Codebook(const CodebookOptions& o, Generator& init_gen) : opt_(o) {
  VQDDP_CHECK(o.codebook_size > 0 && o.dim > 0, "codebook: codebook_size {} and dim {} must be positive",
              o.codebook_size, o.dim);
  VQDDP_CHECK(o.decay >= 0.f && o.decay <= 1.f, "codebook: decay {} outside [0, 1]", o.decay);
  VQDDP_CHECK(o.eps > 0.f, "codebook: eps {} must be positive", o.eps);
  VQDDP_CHECK(o.threshold_ema_dead_code >= 0.f, "codebook: threshold_ema_dead_code {} is negative",
              o.threshold_ema_dead_code);
  VQDDP_CHECK(!o.kmeans_init || o.kmeans_iters >= 1, "codebook: kmeans_iters {} must be at least 1", o.kmeans_iters);
  int64_t k = o.codebook_size, d = o.dim;
  // Kaiming-uniform with fan_in = D (bound sqrt(6 / D)); zeros while k-means
  // init is pending.
  float bound = std::sqrt(6.f / static_cast<float>(d));
  Tensor init = o.kmeans_init ? zeros({k, d}) : rand_uniform({k, d}, init_gen, -bound, bound);
  if (o.cosine && !o.kmeans_init) init = l2_normalize_rows(init);
  if (o.learnable) {
    embed = register_parameter("embed", init);
  } else {
    embed = register_buffer("embed", init);
    embed_avg = register_buffer("embed_avg", init.clone());
    // Counts: a negative one would divide the Laplace smoothing by a
    // negative total and never count as dead.
    cluster_size = register_buffer("cluster_size", full({k}, o.cluster_size_init_ones ? 1.0 : 0.0),
                                   ValueRange::non_negative());
  }
  // A flag; without k-means init the codebook is initialised from the start,
  // and a 0 would run k-means over the trained codes.
  initted_ = register_buffer("initted", full({1}, o.kmeans_init ? 0 : 1, DType::i64),
                             o.kmeans_init ? ValueRange{0, 1} : ValueRange::exactly(1));
  // A stream id: negative ids would replay streams of other purposes.
  draws_ = register_buffer("draws", zeros({1}, DType::i64), ValueRange::non_negative());
}

Generator Codebook::next_shared_generator() {
  int64_t& n = draws_.data<int64_t>()[0];
  draws_.bump_version();
  return Generator(opt_.seed, streams::kCodebookDraws + static_cast<uint64_t>(n++));
}

void Codebook::check_input(const Tensor& x, const Communicator& comm, bool training) const {
  VQDDP_CHECK(x.defined() && x.dtype() == DType::f32 && x.dim() == 2 && x.size(1) == opt_.dim,
              "rank {}: codebook expects float32 rows [N, {}], got {}", comm.rank(), opt_.dim, x.desc());
  if (!training) return;
  // Refuse non-finite input before any state changes: one NaN row would
  // otherwise poison every rank's codebook through the all-reduce.
  if (int64_t at = first_nonfinite(x); at >= 0)
    VQDDP_THROW_NONFINITE("rank {}: row {} of the codebook's input has a non-finite value ({} in column {})", comm.rank(),
                at / opt_.dim, x.detach().reshape({-1}).slice_rows(at, at + 1).item<float>(), at % opt_.dim);
}

Tensor Codebook::prepare(const Tensor& x, const Communicator& comm) const {
  check_input(x, comm, updates_state());
  return opt_.cosine ? l2_normalize_rows(x) : x;
}

Tensor Codebook::codes() const {
  // An EMA cosine codebook is kept unit-length by its update; a learnable
  // one is moved by the optimizer, so it is normalised where it is used
  // (differentiably, so the gradient sees the normalisation).
  return opt_.cosine && opt_.learnable ? l2_normalize_rows(embed) : embed;
}

Tensor Codebook::assign(const Tensor& prepared) const {
  NoGradGuard no_grad;
  return assign_codes(prepared, codes(), opt_.cosine);
}

bool Codebook::ensure_initialised(const Tensor& x, Communicator& comm) {
  if (initted()) return true;
  VQDDP_CHECK(updates_state(), "rank {}: codebook is not initialised (k-means init pending): run a training step or load "
              "a checkpoint before eval or no-grad inference", comm.rank());
  Generator gen = next_shared_generator();
  // k-means runs once per codebook: on the host (the CPU reference), also
  // for a GPU codebook; copy_ moves its result to the codebook's device.
  Tensor xh = x.to(Device::cpu());
  KmeansResult km = kmeans(xh, opt_.codebook_size, opt_.kmeans_iters, opt_.cosine, comm, gen);
  if (!km.means.defined()) return false;  // no rank had rows: every rank stays uninitialised alike
  embed.copy_(km.means);
  if (!opt_.learnable) {
    // embed_avg = means * bins (NOT means): the EMA normalisation divides by
    // the counts again, so this keeps the centroids where k-means put them.
    embed_avg.copy_(mul(km.means, reshape(km.bins, {-1, 1})));
    cluster_size.copy_(km.bins);
  }
  initted_.fill_(1);
  return true;
}

void Codebook::update_ema(const Tensor& stats) {
  if (!embed.device().is_cpu()) {
    ema_update_device(stats, cluster_size, embed_avg, embed, opt_.decay, opt_.eps);
  } else {
    update_ema_cpu(stats);
  }
  if (opt_.cosine) embed.copy_(l2_normalize_rows(embed));
  cluster_size.bump_version();
  embed_avg.bump_version();
  embed.bump_version();
}

void Codebook::update_ema_cpu(const Tensor& stats) {
  int64_t k = opt_.codebook_size, d = opt_.dim;
  const double* counts = stats_counts(stats, k).data<double>();
  const double* sums = stats_sums(stats, k, d).data<double>();
  float* cs = cluster_size.data<float>();
  float* avg = embed_avg.data<float>();
  float* e = embed.data<float>();
  const float decay = opt_.decay, keep = 1.f - opt_.decay;
  for (int64_t c = 0; c < k; ++c) cs[c] = decay * cs[c] + keep * static_cast<float>(counts[c]);
  for (int64_t i = 0; i < k * d; ++i) avg[i] = decay * avg[i] + keep * static_cast<float>(sums[i]);
  // Laplace smoothing: cs~ = (cs + eps) / (n + K eps) * n, so a code with no
  // mass is divided by a small positive number, never by zero.
  double n = 0;
  for (int64_t c = 0; c < k; ++c) n += cs[c];
  // No mass at all (zeros-initialised sizes and nothing seen yet): the
  // smoothed sizes would all be 0, so keep embed as it is.
  for (int64_t c = 0; c < k && n > 0; ++c) {
    float smoothed = static_cast<float>((cs[c] + opt_.eps) / (n + k * double(opt_.eps)) * n);
    for (int64_t j = 0; j < d; ++j) e[c * d + j] = avg[c * d + j] / smoothed;
  }
}

int64_t Codebook::revive_dead_codes(const Tensor& x, Communicator& comm) {
  const float threshold = opt_.threshold_ema_dead_code;
  if (threshold <= 0.f) return 0;
  int64_t k = opt_.codebook_size;
  std::vector<int64_t> expired;
  const std::vector<float> cs = cluster_size.to_vector<float>();  // K floats, read back from a GPU codebook
  for (int64_t c = 0; c < k; ++c)
    if (cs[c] < threshold) expired.push_back(c);  // strict, on state identical across ranks
  if (expired.empty()) return 0;
  Generator gen = next_shared_generator();
  Tensor rows = sample_rows(x, static_cast<int64_t>(expired.size()), comm, gen);  // (m, D)
  if (rows.size(0) == 0) return 0;  // empty global batch: every rank skips alike
  // embed, embed_avg and cluster_size of the expired codes reset together
  // (embed_avg = row * threshold keeps the row through the next EMA).
  int64_t m = static_cast<int64_t>(expired.size());
  Tensor at = from_vector(expired, {m}).to(embed.device());
  index_copy_(embed, at, rows);
  index_copy_(embed_avg, at, rows, threshold);
  index_copy_(cluster_size, at, full({m}, threshold, DType::f32, embed.device()));
  return m;
}

Tensor Codebook::lookup(const Tensor& indices) const { return index_select(codes(), indices); }

CodebookMetrics Codebook::update(const Tensor& x, const Tensor& indices, Communicator& comm) {
  NoGradGuard no_grad;
  int64_t k = opt_.codebook_size;
  CodebookMetrics m;
  Tensor counts;
  if (opt_.learnable) {
    // Counts only, for the metrics; the embed is trained by the optimizer.
    counts = code_stats(zeros({x.size(0), 0}, DType::f32, x.device()), indices, k);  // (K + 0)
    if (opt_.sync_stats) comm.all_reduce(counts, ReduceOp::sum);
  } else {
    Tensor stats = code_stats(x.detach(), indices, k);  // (K + K*D)
    if (opt_.sync_stats) comm.all_reduce(stats, ReduceOp::sum);
    update_ema(stats);
    m.codes_revived = revive_dead_codes(x.detach(), comm);
    counts = stats_counts(stats, k);
  }
  counts = counts.to(Device::cpu());  // K doubles; the metrics are host numbers
  m.perplexity = perplexity(counts.data<double>(), k);
  const double* pc = counts.data<double>();
  for (int64_t c = 0; c < k; ++c) {
    m.codes_used += pc[c] > 0;
    m.rows += static_cast<int64_t>(pc[c]);
  }
  return m;
}

CodebookOutput Codebook::forward(const Tensor& x_in, Communicator& comm) {
  Tensor x = prepare(x_in, comm);  // (N, D)
  if (!ensure_initialised(x.detach(), comm))
    return {zeros({0, opt_.dim}, DType::f32, x.device()), zeros({0}, DType::i64, x.device()),
            CodebookMetrics::empty_world()};  // nobody had rows, on every rank
  Tensor indices = assign(x);        // (N)
  Tensor quantize = lookup(indices);  // (N, D), from the codebook before this step's update
  CodebookMetrics m = updates_state() ? update(x, indices, comm) : CodebookMetrics{};
  return {quantize, indices, m};
}

}  // namespace vqddp
