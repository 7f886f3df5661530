// This rank's batches of the next few steps, read in the background while
// the current step trains. The rows of a step are the sampler's (a pure
// function of (seed, step), train/schedule.h), so a reader needs no state
// from the trainer: a pool of `readers` threads reads steps first,
// first + 1, ... (each thread a whole step at a time) up to `depth` ahead
// of the step last taken, and the trainer takes them in order. What a
// batch holds does not depend on the readers (each row goes to its own
// place), so prefetching changes no bit of a run. Memory: at most
// depth + 1 batches.
// Internal header: not installed with the library (the trainer's reader threads).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "data/dataset.h"
#include "train/schedule.h"

namespace vqddp {

// (n_r, F) host rows of this rank's share of step `step`: the sampler's
// (source, row) pairs read from the data set's sources in order. With
// data.skip_bad_rows, a row that cannot be read is replaced by the next one
// of its source that can (DataRows::read_or_next), and `skipped` counts the
// rows replaced: every rank and a 1-rank run replace a row alike, so the
// global batch stays the 1-rank run's.
Tensor read_rank_batch(const Dataset& data, const ShardedSampler& sampler, int64_t step, int64_t* skipped = nullptr);

class BatchPrefetcher {
 public:
  // Steps [first, last); `depth` batches ahead by `readers` threads (depth
  // 0: none, each batch read when taken).
  BatchPrefetcher(const Dataset& data, const ShardedSampler& sampler, int64_t first, int64_t last, int depth = 4,
                  int readers = 1);
  ~BatchPrefetcher();  // stops the readers (a batch being read is finished first)
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // Step `step`'s batch, steps taken one after another from `first`. An
  // Error reading it is thrown here, on this rank, naming the step (the
  // caller makes it every rank's: comm/agree.h). Adds the rows skipped
  // (read_rank_batch) to `skipped`.
  Tensor take(int64_t step, int64_t& skipped);

 private:
  void work();

  const Dataset& data_;
  const ShardedSampler& sampler_;
  const int64_t last_;
  const int depth_;
  std::mutex mu_;
  std::condition_variable cv_;
  struct Batch {
    Tensor rows;
    std::string error;
    int64_t skipped = 0;
  };
  std::map<int64_t, Batch> ready_;
  int64_t next_;   // the next step a reader starts on
  int64_t taken_;  // the last step taken (first - 1 before any)
  bool stop_ = false;
  std::vector<std::thread> readers_;
};

}  // namespace vqddp
