// The data schedule of a run, and the sharded sampler that follows it.
//
// Every number that decides how many steps (and so how many collectives) a
// rank runs is an integer computed ONCE on rank 0 and broadcast at start:
// examples per source per epoch, steps per epoch, total steps; validation
// and checkpoint steps follow from them. Ranks never derive these from
// their own floats: per-rank sampler weights that differ in the last bit
// once gave one rank an extra step and deadlocked validation
// (deepmd-kit #5570; docs/design.md invariant 7).
//
// Each epoch draws per_source[i] examples from source i (every row once
// before any row twice) in a shuffled order. The order is a pure function
// of (seed, epoch, position), evaluated per example by keyed permutations
// (engine/core/random.h IndexPermutation) in O(1) memory: no epoch list is ever
// built, so a corpus of any size costs the sampler nothing, every rank
// computes exactly its own rows without talking, and a run resumed at any
// step, mid-epoch, continues the order with no saved loader state. Every
// rank takes its contiguous share of each global batch. A share is whole
// UNITS (engine/exact_batch.h): a global batch is cut into runs of
// ceil(batch_size / 32) consecutive examples (the last may be shorter),
// fixed by position alone, so every sum over the batch has the same bits on
// any number of ranks.
#pragma once

#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "train/config.h"

namespace vqddp {

// The learning rate of step `step` (0-based) of `total` (optimizer.lr_schedule):
// a function of the agreed step count only, so every rank and a resumed run
// use the same rate at the same step.
float learning_rate(const OptimizerConfig& o, int64_t step, int64_t total);

struct Schedule {
  std::vector<int64_t> per_source;  // examples from each source per epoch
  int64_t epoch_examples = 0;
  int64_t batch_size = 0;  // global
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  int64_t validate_every = 0;
  int64_t checkpoint_every = 0;
  int64_t log_every = 50;  // the metrics all-reduce runs on these steps: part of the agreement too
  bool drop_last = true;

  // After `done` completed steps (1-based): run validation / write a checkpoint?
  bool validate_after(int64_t done) const;
  bool checkpoint_after(int64_t done) const;
  bool log_after(int64_t done) const;
  bool operator==(const Schedule&) const = default;
};

// The plan from source sizes and weights (largest-remainder split of an
// epoch of sum(sizes) examples by weight). Pure.
Schedule plan_schedule(const std::vector<int64_t>& source_sizes, const std::vector<double>& weights,
                       const ScheduleConfig& config);

// Every rank plans; rank 0's plan is broadcast and used by all (so weights
// that differ in a last bit between ranks cannot split an epoch
// differently). First the ranks compare `data_fingerprint`
// (data/dataset.h) and their example counts: ranks that loaded different
// data all throw the same error, naming the ranks that differ from rank 0.
// Every rank must call (two collectives).
Schedule agree_schedule(const std::vector<int64_t>& source_sizes, const std::vector<double>& weights,
                        const ScheduleConfig& config, Communicator& comm, uint32_t data_fingerprint);

// The step a run starts at (0, or a resumed checkpoint's), which decides how
// many steps every rank runs: one all_reduce (every rank calls it, resumed
// or not) checks that all ranks start alike, and throws on EVERY rank, naming
// the steps, when they do not (e.g. ranks that read different checkpoints),
// instead of letting one rank run a step more and hang the others.
int64_t agree_start_step(int64_t step, Communicator& comm);

// Rows of `rows` split into `world` contiguous shards, as even as possible
// (the first rows % world ranks get one more).
std::vector<int64_t> even_shards(int64_t rows, int world);

// The most units a global batch is cut into: bounds the unit partials an
// exact step keeps (units x parameters) and still leaves up to 32 ranks work.
constexpr int64_t kMaxUnitsPerBatch = 32;
// Examples in each unit of a global batch of `batch_size`, in order.
std::vector<int64_t> unit_sizes(int64_t batch_size);
// First row of rank `rank`'s shard: the rows of the ranks before it.
int64_t shard_begin(const std::vector<int64_t>& shards, int rank);

class ShardedSampler {
 public:
  // `rank_units`: units of each rank (length `world`, summing to the
  // batch's units); empty: as even as possible (even_shards).
  ShardedSampler(Schedule schedule, std::vector<int64_t> source_sizes, uint64_t seed, int rank, int world,
                 std::vector<int64_t> rank_units = {});

  // (source, row) of this rank's share of global step `step` (0-based).
  std::vector<std::pair<int, int64_t>> rank_batch(int64_t step) const;
  // (source, row) at `position` of epoch `epoch`'s order (position <
  // epoch_examples): a position p of source i's share of the epoch (its
  // p-th slot, in source order) takes row sigma(p mod size_i) of a keyed
  // permutation sigma of the source's rows, a new one per epoch, source and
  // pass p / size_i over the rows; a keyed permutation of the epoch's slots
  // then shuffles the sources together.
  std::pair<int, int64_t> example_at(int64_t epoch, int64_t position) const;
  // Rows each rank gets in every global batch.
  const std::vector<int64_t>& shard_sizes() const { return shards_; }
  // Units of each rank, and the examples of each of this rank's units.
  const std::vector<int64_t>& rank_units() const { return rank_units_; }
  const std::vector<int64_t>& unit_examples() const { return unit_examples_; }

 private:
  Schedule schedule_;
  std::vector<int64_t> sizes_;
  uint64_t seed_;
  int rank_;
  std::vector<int64_t> rank_units_, unit_examples_;
  std::vector<int64_t> shards_;
  int64_t begin_;  // shard_begin(shards_, rank_)
  std::vector<int64_t> source_end_;  // per_source's running sums: source i's slots end at source_end_[i]
};

}  // namespace vqddp
