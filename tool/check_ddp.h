// `vqddp check-ddp`: proves a config's data-parallel semantics before GPU
// hours are spent on it.
//
// Whole-run mode (the default): training is exact (engine/exact_batch.h),
// so S steps on W thread ranks must give, after EVERY step, every
// checkpoint tensor (parameters, optimizer moments, codebooks, counters,
// random-stream states) bit for bit as S steps on 1 rank from the same
// start. No tolerance: the first step and tensor that differ are named.
// With backend "mpi" the W ranks are the processes of an MPI job.
//
// Per-step mode (--mode step), the check from before training was exact:
// the run goes once on 1 rank over whole global batches, saving its full
// state (parameters, buffers, optimizer) before every step. Then, for every
// step, W thread ranks start from that same state and take the same step on
// shards of the same batch. Compared, per step:
//   - quantizer state (every buffer: EMA embed, embed_avg, cluster_size,
//     initted, the shared random-stream counters, dropout steps): W ranks
//     must equal 1 rank BIT FOR BIT (invariant 2: the forward is
//     batch-invariant and the statistics are float64 sums, so k-means init,
//     the EMA step and revival are exact on any split);
//   - the global-batch gradient, after its all-reduce and before clipping
//     and the optimizer step, and the parameters after the step: within
//     |a - b| <= atol + rtol * |b| (gradients are sums whose order depends
//     on the split). The gradient is checked on its own because AdamW's
//     first steps divide by the gradient's own magnitude: a tiny gradient
//     difference becomes a full-size difference in the update, which the
//     parameters alone would blame on the optimizer.
// And the W ranks must agree with each other bit for bit on all of it.
//
// Why from a common state, step by step: the only legitimate difference
// between 1 and W ranks is the rounding of gradient sums. Run freely, it
// moves the network, so the codebooks see other inputs; k-means and
// nearest-code assignment then turn 1e-7 into different but equally valid
// codebooks after a few steps (a near-tie row picks the other code), which
// would hide real bugs in noise or fail correct configs. Restarting each
// step from the same state keeps the comparison exact where it can be,
// while every real DDP bug (unreduced codebook statistics, missing gradient
// reduction, ranks taking different dropout or schedule decisions, a
// split-dependent op before the quantizer) shows up in the step it breaks.
#pragma once

#include <string>

#include "engine/core/count_limits.h"
#include "train/config.h"
#include "data/dataset.h"

namespace vqddp {

namespace limits {
inline constexpr CountRange check_steps{1, 100000};         // check-ddp --steps
}  // namespace limits

struct CheckDdpOptions {
  enum class Mode { whole_run, per_step };
  Mode mode = Mode::whole_run;
  // "thread": W thread ranks of this process. "mpi" (whole-run mode only,
  // under mpirun or srun): the W ranks are this MPI job's processes, each
  // comparing its own rank with a 1-rank run it trains itself; `world` is
  // the job's size then, not this field.
  std::string backend = "thread";
  int world = 4;
  int64_t steps = 5;
  double rtol = 1e-4;
  double atol = 1e-6;
  bool print = true;
};

struct CheckDdpResult {
  bool passed = false;
  bool ranks_identical = true;   // W ranks bitwise equal to each other (state, parameters, gradients)
  bool state_bitwise = true;     // quantizer state (buffers) bitwise equal to 1 rank after every step
  double worst_abs = 0;          // largest |W-rank - 1-rank| over every parameter and step
  double worst_grad_abs = 0;     // the same for the all-reduced gradients
  std::string first_failure;     // "step 3: 'quantizer.layer0.embed'[12] ..." when failed
  int64_t tensors = 0;           // whole run: checkpoint tensors compared after each step
};

CheckDdpResult check_ddp(Config config, const Dataset& data, const CheckDdpOptions& options);

}  // namespace vqddp
