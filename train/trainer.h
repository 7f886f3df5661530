// The training loop: data-parallel steps on W ranks, validation, progress,
// metrics, checkpoints.
//
// One step on every rank, an exact step (engine/exact_batch.h): its share
// of the global batch (whole units) -> forward, whose losses are global-batch
// means -> backward, which reduces the units' gradient partials over the
// ranks on the way -> clip -> optimizer step. Every tensor of the run is
// thus the same bits on any number of ranks and any split as on one rank. Every decision that could make ranks call different
// collectives (how many steps, when to log, validate or checkpoint) reads
// the schedule that rank 0 broadcast at start, never a clock or a per-rank
// float. Validation runs in eval mode under no-grad: the modules issue no
// collective there; one all-reduce of the summed metrics ends it.
//
// Device: an nccl rank trains on its own GPU; "single" and "thread" ranks
// on run.device (cuda: all of them on cuda:0). Batches are gathered on the
// host and copied over; metrics, validation sums and checkpoints read host
// copies, so the loop's decisions never depend on where it computes.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "train/checkpoint.h"
#include "train/config.h"
#include "data/dataset.h"
#include "engine/optim.h"
#include "train/model.h"
#include "train/trained_part.h"

namespace vqddp {

struct LayerUsage {
  double perplexity = 0;  // exp(entropy) of the code histogram
  int64_t codes_used = 0;
  int64_t codebook_size = 0;
};

struct TrainResult {
  // True in the process that ran rank 0, the only one whose fields below are
  // filled (with nccl every other process returns lead = false).
  bool lead = false;
  int64_t steps = 0;               // steps completed in total (also before a resume)
  double validation_mse = 0;
  double validation_snr_db = 0;    // 10 log10(sum x^2 / sum (x - x_hat)^2) over the validation set
  double validation_log_mel = -1;  // mean |log-mel(x) - log-mel(x_hat)| (audio; -1 for images)
  // The multi-resolution STFT distance (train/spectral.h stft_distance) at
  // 8, 16 and 32 ms windows (at 8 kHz), averaged (audio; -1 for images).
  double validation_stft_distance = -1;
  double validation_stoi = -1;  // STOI (train/stoi.h) of the held-out chunks long enough for it (audio; -1: none)
  double bits_per_example = 0;
  double bitrate = 0;              // bits per second (audio), 0 for images
  std::vector<LayerUsage> usage;   // per quantizer layer, on the validation set
  double wall_seconds = 0;
  // The signal that stopped the run early (opt.stop_requested), 0 if none:
  // `steps` were taken, the checkpoint holds them, no validation ran.
  int stopped_by = 0;
  // Steps run as one replay of a captured step graph (run.step_graphs: a
  // world of one on cuda or sim, thread ranks on sim), 0 where steps issue
  // their launches.
  int64_t graph_replays = 0;
  // With TrainOptions::profile (zeros without): the world's FLOPs per
  // training step (engine/kernel_flops.h), rank 0's seconds per step under
  // the profile, and the GEMM floor they are measured against.
  struct Profile {
    double gflop_per_step = 0, seconds_per_step = 0, gemm_floor = 0;
    // The world's GFLOP/s as a share of the floor (0 to 1, or more).
    double floor_share() const {
      return seconds_per_step > 0 && gemm_floor > 0 ? gflop_per_step / seconds_per_step / gemm_floor : 0;
    }
  } profile;
};

// What the after_step hook is handed: the steps done, the rank, the codec
// and every part the run trains (train/trained_part.h: the codec first,
// then a GAN run's discriminators), e.g. to snapshot or checkpoint them
// (checkpoint_tensors(view.parts)).
struct StepView {
  int64_t step;
  int rank;
  const CodecModel& codec;
  std::span<const TrainedPart> parts;
};

struct TrainOptions {
  std::string resume;        // checkpoint to continue from ("" = start fresh)
  // How the run's errors tell a user to continue it (a stop for a full
  // disk): the whole command (the executable's), or "" for "--resume PATH".
  std::string resume_hint;
  // A fresh run into a directory holding a run: false refuses it, true
  // removes the old run's checkpoint and metrics first (train/run_dir.h).
  bool overwrite = false;
  // `train --resume auto` found no checkpoint: RunStart::unsaved.
  bool replace_unsaved = false;
  int64_t stop_at_step = 0;  // > 0: stop (and checkpoint) after this step, schedule unchanged
  bool validate = true;
  bool checkpoints = true;
  bool print = true;         // progress lines on rank 0
  // Rank 0 times its training steps op by op (engine/op_profile.h) and
  // prints the table at the end (`vqddp train --profile`).
  bool profile = false;
  // The GEMM floor the profile measures against, in GFLOP/s
  // (engine/gemm_floor.h); 0: measured on the run's device at the start
  // (half a second on 2 cores). Give it where processes share a machine
  // (mpirun on one node), as each would measure only its share.
  double gemm_floor = 0;
  // Called on every rank after every step (StepView above).
  std::function<void(const StepView& view)> after_step;
  // Called on every rank once the gradients are the global batch's (after
  // their all-reduce), before clipping and the optimizer step; step = the
  // number of the step being taken, counted from 1 as after_step counts.
  std::function<void(int64_t step, int rank, const CodecModel& model)> after_gradients;
  // Units of the global batch each rank trains on (length W, adding up to
  // the batch's units, train/schedule.h); empty: as even as possible. For
  // tests of uneven splits and ranks without rows.
  std::vector<int64_t> rank_units;
  // Polled on every rank after every step: non-zero (a signal number) asks
  // to stop. The ranks agree on it with one all-reduce (max), so all of them
  // stop after the same step, which is checkpointed. Unset: no collective.
  std::function<int()> stop_requested;
};

TrainResult train(const Config& config, const Dataset& data, const TrainOptions& options);

}  // namespace vqddp
