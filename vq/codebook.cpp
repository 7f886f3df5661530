#include "vq/codebook.h"

#include <cmath>
#include <cstring>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/core/streams.h"
#include "vq/assign.h"
#include "vq/code_stats.h"
#include "vq/gumbel_sample.h"
#include "vq/kmeans.h"
#include "vq/kernels/vq_kernels.h"
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
  VQDDP_CHECK(!o.track_usage || (o.learnable && !o.cosine),
              "codebook: usage tracking is for learnable Euclidean codebooks");
  if (o.learnable) embed = register_parameter("embed", init);
  else embed = register_buffer("embed", init);
  if (tracks_usage()) {
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
  VQDDP_CHECK(!o.affine_param || !o.cosine, "codebook: affine_param needs a Euclidean codebook (use_cosine_sim false)");
  if (o.affine_param)
    affine_ = register_module("affine", std::make_shared<CodebookAffine>(d, o.affine_param_batch_decay,
                                                                          o.affine_param_codebook_decay));
}

Generator Codebook::next_shared_generator() {
  int64_t& n = draws_.data<int64_t>()[0];
  draws_.bump_version();
  return Generator(opt_.seed, streams::kCodebookDraws + static_cast<uint64_t>(n++));
}

void Codebook::check_input(const Tensor& x, const Communicator& comm) const {
  VQDDP_CHECK(x.defined() && x.dtype() == DType::f32 && x.dim() == 2 && x.size(1) == opt_.dim,
              "rank {}: codebook expects float32 rows [N, {}], got {}", comm.rank(), opt_.dim, x.desc());
  // Non-finite rows are flagged in the statistics (code_stats.h), so every
  // rank learns of them in the step's one collective and refuses alike.
}

Tensor Codebook::prepare(const Tensor& x, const Communicator& comm) const {
  check_input(x, comm);
  return opt_.cosine ? l2_normalize_rows(x) : x;
}

Tensor Codebook::codes() const {
  // An EMA cosine codebook is kept unit-length by its update; a learnable
  // one is moved by the optimizer, so it is normalised where it is used
  // (differentiably, so the gradient sees the normalisation).
  Tensor base = opt_.cosine && opt_.learnable ? l2_normalize_rows(embed) : embed;
  return affine_ ? affine_->to_batch_space(base) : base;
}

Tensor Codebook::assign(const Tensor& prepared) const {
  NoGradGuard no_grad;
  return assign_codes(prepared, codes(), opt_.cosine);
}

Tensor Codebook::choose(const Tensor& x, Communicator& comm) {
  if (!(opt_.stochastic_sample && opt_.sample_temperature > 0 && updates_state())) return assign(x);
  const int64_t first_row = first_global_row(comm, x.size(0));  // host numbers: no device wait
  NoGradGuard no_grad;
  return gumbel_sample_codes(x.detach(), codes().detach(), opt_.cosine, opt_.sample_temperature, first_row,
                             next_shared_generator());
}

bool Codebook::ensure_initialised(const Tensor& x, Communicator& comm) {
  if (initted()) return true;
  VQDDP_CHECK(updates_state(), "rank {}: codebook is not initialised (k-means init pending): run a training step or load "
              "a checkpoint before eval or no-grad inference", comm.rank());
  Generator gen = next_shared_generator();
  // k-means runs once per codebook, on the codebook's device.
  KmeansResult km = kmeans(x, opt_.codebook_size, opt_.kmeans_iters, opt_.cosine, comm, gen);
  if (!km.means.defined()) return false;  // no rank had rows: every rank stays uninitialised alike
  embed.copy_(km.means);
  if (tracks_usage()) {
    // embed_avg = means * bins (NOT means): the EMA normalisation divides by
    // the counts again, so this keeps the centroids where k-means put them.
    embed_avg.copy_(mul(km.means, reshape(km.bins, {-1, 1})));
    cluster_size.copy_(km.bins);
  }
  initted_.fill_(1);
  return true;
}

void Codebook::revive_dead_codes(const Tensor& x, Tensor& stats, const StatsLayout& layout, Communicator& comm) {
  const float threshold = opt_.threshold_ema_dead_code;
  int64_t k = opt_.codebook_size, d = opt_.dim;
  // One shared stream per step, drawn whether or not a code expired: which
  // codes expired is known on the device only. The draws cover every case
  // the device may meet (sampler.h's rule, decided there by m <= N), so the
  // revived rows are the ones the sampler would give for those m codes.
  Generator without = next_shared_generator(), with = without;
  std::vector<int64_t> counts = all_gather_counts(comm, x.size(0));  // host numbers: no device wait
  RevivalDraws draws;
  for (int r = 0; r < comm.world_size(); ++r) {
    if (r < comm.rank()) draws.first_row += counts[r];
    draws.total_rows += counts[r];
  }
  if (draws.total_rows == 0) return;  // empty global batch: every rank skips alike
  const Device dev = embed.device();
  std::vector<int64_t> a = draw_row_numbers(draws.total_rows, std::min(draws.total_rows, k), without);
  std::vector<int64_t> b = draws.total_rows < k ? draw_row_numbers(draws.total_rows, k, with) : std::vector<int64_t>{};
  draws.without_replacement = from_vector(a, {static_cast<int64_t>(a.size())}).to(dev);
  draws.with_replacement = from_vector(b, {static_cast<int64_t>(b.size())}).to(dev);
  VqKernels& vq = vq_kernels(dev);
  Tensor block = empty({k, d}, DType::f32, dev);
  vq.revival_candidates(x, cluster_size, threshold, draws, block);
  comm.all_reduce(block, ReduceOp::sum);  // every rank's drawn rows, -0.0 elsewhere: the rows bit for bit
  // embed, embed_avg and cluster_size of the expired codes reset together
  // (embed_avg = row * threshold keeps the row through the next EMA).
  vq.revive(block, layout, threshold, stats, cluster_size, embed_avg, embed);
}

Tensor Codebook::lookup(const Tensor& indices, Indices from) const { return index_select(codes(), indices, from); }

CodebookMetrics Codebook::update(const Tensor& x, const Tensor& indices, Communicator& comm) {
  return update_layers({}, {}, x, indices, comm);
}

CodebookMetrics Codebook::update_layers(const std::vector<Tensor>& xs, const std::vector<Tensor>& indices,
                                        const Tensor& all_rows, const Tensor& all_indices, Communicator& comm) {
  NoGradGuard no_grad;
  VQDDP_CHECK(xs.size() == indices.size(), "codebook update: {} row sets for {} index sets", xs.size(), indices.size());
  const Device dev = all_rows.device();
  // Learnable: counts only, for the metrics (the embed is trained by the
  // optimizer). EMA: counts and sums.
  StatsLayout layout{opt_.codebook_size, tracks_usage() ? opt_.dim : 0, comm.world_size(), opt_.dim};
  // The statistics of all rows (metrics, non-finite flags, revival), then
  // those of each row set, all in one all-reduce. With affine_param the
  // statistics see the rows in the codebook's space; revival takes the
  // rows as they are, as the reference.
  // The sums are exact (code_stats.h): every rank rounds its rows to the
  // grid of the largest value over all of them, agreed by one max
  // all-reduce (this rank's own in the unsynchronised mode). all_rows holds
  // every set's rows (the contract of update_layers), so its largest value
  // is theirs: one scan, not one per set as well.
  std::vector<Tensor> rows{all_rows.detach()};
  for (const Tensor& x : xs) rows.push_back(x.detach());
  if (affine_)
    for (Tensor& r : rows) r = affine_->to_codebook_space(r);
  const Tensor grid = layout.d > 0 ? grid_scale({rows[0]}, opt_.sync_stats ? &comm : nullptr) : Tensor();
  std::vector<Tensor> own{code_stats(rows[0], all_indices, layout, comm.rank(), grid)};
  for (size_t l = 0; l < xs.size(); ++l) own.push_back(code_stats(rows[l + 1], indices[l], layout, comm.rank(), grid));
  Tensor buffer = own.size() == 1 ? own[0] : concat(own, 0);
  const int64_t size = own[0].numel();
  auto block = [&](size_t i) {
    return buffer.slice_rows(static_cast<int64_t>(i) * size, static_cast<int64_t>(i + 1) * size);
  };
  Tensor stats = block(0);
  if (opt_.sync_stats) {
    comm.all_reduce(buffer, ReduceOp::sum);
  } else {
    // The deliberately unsynchronised mode still shares the non-finite
    // flags, so a bad row stops every rank alike instead of leaving the
    // others waiting in their next collective.
    Tensor flags = stats.slice_rows(layout.flag(0), layout.revived());
    comm.all_reduce(flags, ReduceOp::sum);
  }
  // On the host the flags cost nothing to read: refuse now, before any state
  // changes. On a device the update kernels skip a flagged step and the
  // error comes when the metrics are read.
  if (dev.is_cpu()) check_nonfinite_flags(stats, layout);
  if (tracks_usage() && (opt_.ema_update || opt_.threshold_ema_dead_code > 0.f)) {
    VqKernels& vq = vq_kernels(dev);
    // Without ema_update (and for a learnable codebook, which the optimizer
    // trains) the statistics move (revival reads them) but the codes are put
    // back: the kernel writes them with the statistics.
    const Tensor kept = opt_.ema_update && !opt_.learnable ? Tensor() : embed.detach().clone();
    if (xs.empty()) {
      vq.ema_update(stats, layout, cluster_size, embed_avg, embed, opt_.decay, opt_.eps);
    } else {
      // One EMA step per row set, in order, as each layer of the
      // reference's ResidualVQ steps the one shared codebook; the codes
      // come from the last step's statistics. A set's block carries the
      // same non-finite flags as the whole (a bad row poisons every later
      // layer's residual too), so the kernels skip alike.
      for (size_t l = 0; l < xs.size(); ++l)
        vq.ema_update(block(l + 1), layout, cluster_size, embed_avg, embed, opt_.decay, opt_.eps);
    }
    if (kept.defined()) embed.copy_(kept);
    else if (opt_.cosine) embed.copy_(l2_normalize_rows(embed));
    if (opt_.threshold_ema_dead_code > 0.f) revive_dead_codes(all_rows.detach(), stats, layout, comm);
    cluster_size.bump_version();
    embed_avg.bump_version();
    embed.bump_version();
  }
  return CodebookMetrics::on_device(stats, layout);
}

std::optional<CodebookAssignment> Codebook::nearest(const Tensor& x_in, Communicator& comm, const Tensor& given) {
  Tensor x = prepare(x_in, comm);  // (N, D)
  if (!ensure_initialised(x.detach(), comm)) return std::nullopt;
  if (affine_ && updates_state()) affine_->update(x.detach(), embed.detach(), comm);  // before the codes are used
  Tensor indices = given.defined() ? to_device(given, x.device()) : choose(x, comm);  // (N)
  Tensor codes = lookup(indices, Indices::trusted);  // (N, D), from the codebook before this step's update
  return CodebookAssignment{x, indices, codes};
}

CodebookOutput Codebook::forward(const Tensor& x_in, Communicator& comm) {
  std::optional<CodebookAssignment> a = nearest(x_in, comm);
  if (!a)
    return {zeros({0, opt_.dim}, DType::f32, x_in.device()), zeros({0}, DType::i64, x_in.device()),
            CodebookMetrics::empty_world()};  // nobody had rows, on every rank
  CodebookMetrics m = updates_state() ? update(a->prepared, a->indices, comm) : CodebookMetrics{};
  return {a->codes, a->indices, m};
}

}  // namespace vqddp
