// One rank's run, step by step: train() (train/trainer.h) starts one per
// rank and each rank runs its own. Its rooms:
//   - rank_run.cpp: the start (the parts built, the identity, schedule and
//     resume agreed) and the loop, with the checks after each step;
//   - rank_step.cpp: one training step, graphed or not;
//   - train/gan.h (GanPart): a GAN step's discriminators;
//   - train/step_health.h: the step's log and health;
//   - train/validation.h: validation;
//   - train/run_records.h: the directory, lines, metrics and checkpoints;
//   - train/run_stop.h: stops for a signal or a full disk.
//
// Internal header: not installed with the library (the trainer's rank).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "data/dataset.h"
#include "engine/device_counters.h"
#include "engine/step_graph.h"
#include "train/batch_prefetch.h"
#include "train/config.h"
#include "train/gan.h"
#include "train/model.h"
#include "train/run_records.h"
#include "train/run_stop.h"
#include "train/schedule.h"
#include "train/step_health.h"
#include "train/trained_part.h"
#include "train/trainer.h"
#include "train/validation.h"

namespace vqddp {

// Refuses, before anything is trained or written, a device this run cannot
// use, with a message that says why.
void check_device(Device device);

class RankRun {
 public:
  RankRun(const Config& cfg, const Dataset& data, const TrainOptions& opt, Communicator& comm,
          const std::vector<int64_t>& sizes, uint32_t fingerprint);

  // Collective: the loop, from the start step to the last (or a stop every
  // rank agreed on), then what rank 0 reports into `result`.
  void run(TrainResult& result, std::mutex& result_mu);

 private:
  using Clock = std::chrono::steady_clock;

  // What one training step leaves for the checks after it.
  struct StepResult {
    Tensor host_x;  // this rank's examples, on the host (for error messages)
    ModelOutput out;
    Tensor loss;
    // A GAN step's parts of the codec's loss (undefined in the warm-up and
    // without "gan"): the adversarial and feature-matching losses.
    Tensor adversarial, feature;
    // The discriminators' loss, on a step that updates them (undefined on
    // the others): a line logs its own step's, never one carried from an
    // earlier step, which a resumed process would not have.
    Tensor discriminator;
  };

  // rank_step.cpp
  StepResult graphed_step(std::optional<StepGraph>& graph, ShardedSampler& sampler, BatchPrefetcher& batches);
  StepResult train_step(ShardedSampler& sampler, BatchPrefetcher& batches);
  void gan_step(const Tensor& x, StepResult& r);
  std::string step_graph_refusal() const;

  // rank_run.cpp
  void checks_after(int64_t done, const StepResult& r);
  void log_step(int64_t done, const StepResult& r);
  void report(TrainResult& result, std::mutex& result_mu) const;

  const Config& cfg_;
  const Dataset& data_;
  const TrainOptions& opt_;
  Communicator& comm_;
  const std::vector<int64_t>& sizes_;
  const bool lead_;
  const Device device_;
  CodecModel model_;
  std::vector<Tensor> params_;
  std::unique_ptr<Optimizer> optim_;
  std::unique_ptr<GanPart> gan_;  // a GAN run's discriminators (null without "gan")
  // Every trained part, the codec first (train/trained_part.h).
  std::vector<TrainedPart> parts_;
  Schedule schedule_;
  RunRecords records_;
  RunStop stop_;
  std::vector<int64_t> layer_sizes_;
  int64_t step_ = 0;     // steps done
  int64_t last_ = 0;     // the step this run ends after
  int64_t first_ = 0;    // the step this process started at (for the speed)
  int64_t checked_ = 0;  // the last step the health was read at
  Clock::time_point loop_start_;
  std::optional<StepHealth> health_;
  Validation val_;
  int64_t graph_replays_ = 0;   // steps run as a replay of the captured step graph
  // The FLOPs of this rank's training steps since the run started
  // (engine/kernel_flops.h), and with --profile rank 0's figures.
  int64_t step_flops_ = 0;
  TrainResult::Profile profile_;
  // Rows this rank's batches passed over (data.bad_files "skip"), since the run started.
  int64_t skipped_rows_ = 0;
  // The first error reading this rank's rows since the run started (train_step).
  std::string read_failure_;
};

}  // namespace vqddp
