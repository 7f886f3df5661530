#include "train/batch_prefetch.h"

#include <fmt/format.h>

#include "engine/core/error.h"
#include "engine/ops.h"

namespace vqddp {

Tensor read_rank_batch(const Dataset& data, const ShardedSampler& sampler, int64_t step, int64_t* skipped) {
  const std::vector<std::pair<int, int64_t>> rows = sampler.rank_batch(step);
  const int64_t f = data.example_dim;
  Tensor x = empty({static_cast<int64_t>(rows.size()), f});
  float* p = x.data<float>();
  for (const auto& [src, row] : rows) {
    const bool replaced = data.sources[src].read_or_next(row, p, data.skip_bad_rows);
    if (skipped) *skipped += replaced;
    p += f;
  }
  return x;
}

BatchPrefetcher::BatchPrefetcher(const Dataset& data, const ShardedSampler& sampler, int64_t first, int64_t last,
                                 int depth, int readers)
    : data_(data), sampler_(sampler), last_(last), depth_(depth), next_(first), taken_(first - 1) {
  VQDDP_CHECK(depth >= 0 && readers >= 1, "prefetch: depth {} and {} readers", depth, readers);
  if (depth_ > 0 && first < last)
    for (int r = 0; r < std::min(readers, depth_); ++r) readers_.emplace_back([this] { work(); });
}

BatchPrefetcher::~BatchPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : readers_) t.join();
}

void BatchPrefetcher::work() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_ && next_ < last_) {
    if (next_ > taken_ + depth_) {
      cv_.wait(lock);
      continue;
    }
    const int64_t step = next_++;
    lock.unlock();
    Batch b;
    try {
      b.rows = read_rank_batch(data_, sampler_, step, &b.skipped);
    } catch (const std::exception& e) {
      b.error = e.what();
    }
    lock.lock();
    ready_[step] = std::move(b);
    cv_.notify_all();
  }
}

Tensor BatchPrefetcher::take(int64_t step, int64_t& skipped) {
  VQDDP_CHECK(step == taken_ + 1 && step < last_, "prefetch: step {} asked for, step {} due (of {})", step + 1,
              taken_ + 2, last_);
  Batch b;
  if (depth_ == 0) {
    taken_ = step;
    try {
      b.rows = read_rank_batch(data_, sampler_, step, &b.skipped);
    } catch (const std::exception& e) {
      b.error = e.what();
    }
  } else {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return ready_.count(step) > 0; });
    b = std::move(ready_[step]);
    ready_.erase(step);
    taken_ = step;
    cv_.notify_all();
  }
  VQDDP_CHECK(b.error.empty(), "step {}: reading this rank's batch: {}", step + 1, b.error);
  skipped += b.skipped;
  return b.rows;
}

}  // namespace vqddp
