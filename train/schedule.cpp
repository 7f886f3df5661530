#include "train/schedule.h"

#include <cmath>
#include <numbers>

#include <algorithm>
#include <numeric>

#include "comm/agree.h"
#include "engine/core/random.h"
#include "engine/core/streams.h"

namespace vqddp {

bool Schedule::validate_after(int64_t done) const {
  return done == total_steps || (validate_every > 0 && done % validate_every == 0);
}

bool Schedule::log_after(int64_t done) const { return done == total_steps || done % log_every == 0; }

bool Schedule::checkpoint_after(int64_t done) const {
  return done == total_steps || (checkpoint_every > 0 && done % checkpoint_every == 0);
}

std::vector<int64_t> even_shards(int64_t rows, int world) {
  std::vector<int64_t> s(world, rows / world);
  for (int r = 0; r < rows % world; ++r) ++s[r];
  return s;
}

std::vector<int64_t> unit_sizes(int64_t batch_size) {
  int64_t per = (batch_size + kMaxUnitsPerBatch - 1) / kMaxUnitsPerBatch;
  std::vector<int64_t> units;
  for (int64_t at = 0; at < batch_size; at += per) units.push_back(std::min(per, batch_size - at));
  return units;
}

Schedule plan_schedule(const std::vector<int64_t>& sizes, const std::vector<double>& weights, const ScheduleConfig& c) {
  VQDDP_CHECK(!sizes.empty() && sizes.size() == weights.size(), "schedule: {} sources with {} weights", sizes.size(),
              weights.size());
  Schedule s;
  s.epoch_examples = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  VQDDP_CHECK(s.epoch_examples > 0, "schedule: the data sources hold no examples");
  // Largest remainder: floor of each share, then the leftover examples to
  // the largest fractional parts (ties to the lower source index).
  double total_weight = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<double> exact;
  int64_t given = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    exact.push_back(weights[i] / total_weight * static_cast<double>(s.epoch_examples));
    s.per_source.push_back(static_cast<int64_t>(exact.back()));
    given += s.per_source.back();
  }
  std::vector<size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return exact[a] - std::floor(exact[a]) > exact[b] - std::floor(exact[b]);
  });
  for (size_t k = 0; given < s.epoch_examples; ++k, ++given) ++s.per_source[order[k % order.size()]];
  s.batch_size = c.batch_size;
  s.drop_last = c.drop_last;
  s.steps_per_epoch = c.drop_last ? s.epoch_examples / c.batch_size : (s.epoch_examples + c.batch_size - 1) / c.batch_size;
  VQDDP_CHECK(s.steps_per_epoch > 0, "schedule: an epoch of {} examples has no full batch of {} (drop_last)",
              s.epoch_examples, c.batch_size);
  s.total_steps = c.steps > 0 ? c.steps : c.epochs * s.steps_per_epoch;
  s.validate_every = c.validate_every;
  s.checkpoint_every = c.checkpoint_every;
  s.log_every = c.log_every;
  return s;
}

Schedule agree_schedule(const std::vector<int64_t>& sizes, const std::vector<double>& weights, const ScheduleConfig& c,
                        Communicator& comm, uint32_t data_fingerprint) {
  {
    const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
    std::vector<std::vector<int64_t>> all =
        gather_values(comm, {int64_t{data_fingerprint}, static_cast<int64_t>(sizes.size()), total});
    std::string differ;
    for (int r = 1; r < comm.world_size(); ++r)
      if (all[r] != all[0])
        differ += fmt::format("{}rank {} ({} examples in {} sources)", differ.empty() ? "" : ", ", r, all[r][2], all[r][1]);
    VQDDP_CHECK_EVERY_RANK(differ.empty(), "the ranks loaded different data: rank 0 has {} examples in {} sources, and these ranks "
                "differ from it: {}. Every rank must read the same data (the same sources, files and sizes; data "
                "fingerprints differ)", all[0][2], all[0][1], differ);
  }
  Schedule mine = plan_schedule(sizes, weights, c);
  // [epoch_examples, batch, steps_per_epoch, total, validate_every,
  //  checkpoint_every, log_every, drop_last, per_source...]: rank 0's numbers win.
  std::vector<int64_t> packed{mine.epoch_examples,   mine.batch_size,       mine.steps_per_epoch, mine.total_steps,
                              mine.validate_every,   mine.checkpoint_every, mine.log_every,       mine.drop_last ? 1 : 0};
  packed.insert(packed.end(), mine.per_source.begin(), mine.per_source.end());
  Tensor t = from_vector(packed, {static_cast<int64_t>(packed.size())});
  comm.broadcast(t, 0);
  const int64_t* p = t.data<int64_t>();
  Schedule s;
  s.epoch_examples = p[0];
  s.batch_size = p[1];
  s.steps_per_epoch = p[2];
  s.total_steps = p[3];
  s.validate_every = p[4];
  s.checkpoint_every = p[5];
  s.log_every = p[6];
  s.drop_last = p[7] != 0;
  s.per_source.assign(p + 8, p + t.numel());
  return s;
}

int64_t agree_start_step(int64_t step, Communicator& comm) {
  Tensor range = from_vector(std::vector<int64_t>{step, -step}, {2});  // max of both: the largest and the smallest
  comm.all_reduce(range, ReduceOp::max);
  int64_t high = range.data<int64_t>()[0], low = -range.data<int64_t>()[1];
  VQDDP_CHECK_EVERY_RANK(low == high, "rank {}: ranks start at different steps ({} to {}; this rank {}): every rank must resume "
              "from the same checkpoint", comm.rank(), low, high, step);
  return step;
}

int64_t shard_begin(const std::vector<int64_t>& shards, int rank) {
  return std::accumulate(shards.begin(), shards.begin() + rank, int64_t{0});
}

ShardedSampler::ShardedSampler(Schedule schedule, std::vector<int64_t> sizes, uint64_t seed, int rank, int world,
                               std::vector<int64_t> rank_units)
    : schedule_(std::move(schedule)), sizes_(std::move(sizes)), seed_(seed), rank_(rank) {
  std::vector<int64_t> units = unit_sizes(schedule_.batch_size);
  const auto total = static_cast<int64_t>(units.size());
  if (rank_units.empty()) rank_units = even_shards(total, world);
  VQDDP_CHECK(static_cast<int>(rank_units.size()) == world &&
                  std::all_of(rank_units.begin(), rank_units.end(), [](int64_t u) { return u >= 0; }) &&
                  std::accumulate(rank_units.begin(), rank_units.end(), int64_t{0}) == total,
              "sampler: {} unit counts for {} ranks must be non-negative and add up to the batch's {} units "
              "(batch_size {})", rank_units.size(), world, total, schedule_.batch_size);
  rank_units_ = std::move(rank_units);
  for (int r = 0, u = 0; r < world; ++r) {
    int64_t examples = 0;
    for (int64_t i = 0; i < rank_units_[r]; ++i, ++u) {
      examples += units[u];
      if (r == rank) unit_examples_.push_back(units[u]);
    }
    shards_.push_back(examples);
  }
  begin_ = shard_begin(shards_, rank);
  VQDDP_CHECK(sizes_.size() == schedule_.per_source.size() && sizes_.size() <= 4096,
              "sampler: {} source sizes for {} sources (at most 4096)", sizes_.size(), schedule_.per_source.size());
  int64_t end = 0;
  for (size_t i = 0; i < sizes_.size(); ++i) {
    VQDDP_CHECK(sizes_[i] > 0 || schedule_.per_source[i] == 0, "sampler: source {} has no rows", i);
    source_end_.push_back(end += schedule_.per_source[i]);
  }
}

std::pair<int, int64_t> ShardedSampler::example_at(int64_t epoch, int64_t position) const {
  VQDDP_CHECK(epoch >= 0 && epoch < (int64_t{1} << 24), "sampler: epoch {} (at most 2^24 epochs)", epoch);
  const IndexPermutation slots(static_cast<uint64_t>(schedule_.epoch_examples), seed_,
                               streams::kSampler + static_cast<uint64_t>(epoch));
  const auto slot = static_cast<int64_t>(slots(static_cast<uint64_t>(position)));
  const auto source = static_cast<int>(std::upper_bound(source_end_.begin(), source_end_.end(), slot) - source_end_.begin());
  const int64_t within = slot - (source == 0 ? 0 : source_end_[source - 1]);
  const int64_t size = sizes_[source], pass = within / size;
  // Tweak: the source in the high 12 bits, the pass in the low 20 (a pass
  // beyond 2^20, a source drawn a million times over, reuses a permutation).
  const IndexPermutation rows(static_cast<uint64_t>(size), seed_, streams::kSamplerRows + static_cast<uint64_t>(epoch),
                              static_cast<uint32_t>(source) << 20 | static_cast<uint32_t>(pass & 0xFFFFF));
  return {source, static_cast<int64_t>(rows(static_cast<uint64_t>(within % size)))};
}

std::vector<std::pair<int, int64_t>> ShardedSampler::rank_batch(int64_t step) const {
  const int64_t epoch = step / schedule_.steps_per_epoch, pos = step % schedule_.steps_per_epoch;
  std::vector<std::pair<int, int64_t>> out;
  for (int64_t j = begin_; j < begin_ + shards_[rank_]; ++j)
    out.push_back(example_at(epoch, (pos * schedule_.batch_size + j) % schedule_.epoch_examples));
  return out;
}

float learning_rate(const OptimizerConfig& o, int64_t step, int64_t total) {
  if (o.lr_schedule == "constant" || total <= 1) return o.lr;
  double t = static_cast<double>(step) / static_cast<double>(total - 1);  // 0 at the first step, 1 at the last
  double f = o.final_lr_fraction;
  return static_cast<float>(o.lr * (f + (1 - f) * 0.5 * (1 + std::cos(std::numbers::pi * t))));
}

}  // namespace vqddp
