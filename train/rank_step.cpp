// One training step of a rank (train/rank_run.h): an exact step, replayed
// from a captured step graph where the run allows one. The graph's check
// (engine/step_graph.h: every launch of a replayed step is the captured
// one's, by kernel and signature) is the one check that a step is
// capturable; on sim every shipped example's run is graphed, so CI runs it
// without a GPU.
#include <fmt/format.h>

#include "comm/batch_reduce.h"
#include "engine/autograd.h"
#include "engine/device_counters.h"
#include "engine/exact_batch.h"
#include "engine/op_profile.h"
#include "engine/ops.h"
#include "engine/step_graph.h"
#include "train/console.h"
#include "train/rank_run.h"

namespace vqddp {

// After the warm-up (k-means, the optimizer's first step), every step is
// the captured one again.
RankRun::StepResult RankRun::graphed_step(std::optional<StepGraph>& graph, ShardedSampler& sampler,
                                          BatchPrefetcher& batches) {
  const bool graphed = graph && step_ >= first_ + 2;
  // The step before the capture is issued under the graph, so that the
  // capture recalls its row counts: no graphed step runs a host collective.
  const bool issued = graph && step_ == first_ + 1;
  if (graphed) graph->begin_step(step_ + 1);
  if (issued) graph->begin_issued_step(step_ + 1);
  StepResult r;
  const int64_t flops_before = device_counters().flops;
  try {
    r = train_step(sampler, batches);
    step_flops_ += device_counters().flops - flops_before;
  } catch (...) {
    if (graphed || issued) graph->abandon_step();
    throw;
  }
  if (issued) graph->end_step();
  if (graphed) {
    graph->end_step();
    graph_replays_ = graph->replays();
    const bool says = lead_ && opt_.print;
    if (!graph->stopped_because().empty()) {
      if (says) progress("train: step graphs off from step {}: {}\n", step_ + 2, graph->stopped_because());
      graph.reset();
    } else if (says && step_ == first_ + 2) {
      progress("train: step graphs on: step {} captured ({} launches), every later step is its replay (a step that "
               "chooses its launches on the host replays each choice's graph, captured the second time it is made)\n", step_ + 1,
               graph->launches());
    }
  }
  return r;
}

// Forward, backward, clipping and the optimizer step of step_ + 1.
RankRun::StepResult RankRun::train_step(ShardedSampler& sampler, BatchPrefetcher& batches) {
  std::optional<OpProfileScope> profile;
  if (opt_.profile && lead_) profile.emplace(device_);
  StepResult r;
  // A rank that cannot read its rows (a file gone, changed or cut since
  // the start) trains this step on zeros and keeps the error, which every
  // rank raises at the next log, validation or checkpoint, before anything
  // is written (checks_after): no collective a step, so no wait for a GPU.
  try {
    r.host_x = batches.take(step_, skipped_rows_);  // (n_r, F)
  } catch (const Error& e) {
    if (read_failure_.empty()) read_failure_ = e.what();
    r.host_x = zeros({sampler.shard_sizes()[comm_.rank()], data_.example_dim});
  }
  Tensor x = r.host_x.to(device_);
  op_profile_mark("step: the batch");
  {
    // An exact step: every sum over the batch by units (engine/exact_batch.h),
    // so the loss is the global batch's on every rank and backward() ends
    // with its gradients, the same bits as one rank on the whole batch.
    ExactBatchScope exact(exact_batch_for(comm_, sampler.unit_examples(), sampler.rank_units()));
    try {
      r.out = model_.forward(x, comm_);
      r.loss = add(r.out.reconstruction_loss, r.out.quantizer_loss);
      if (gan_) gan_step(x, r);
      // Kept on the device, read only where the run logs, validates or
      // writes a checkpoint, so a diverged step on a device never reaches
      // a checkpoint.
      health_->note(r.loss);
    } catch (const NonFiniteError& e) {
      rethrow_nonfinite(e, fmt::format("step {}, rank {}: {}; {}", step_ + 1, comm_.rank(), e.what(),
                                       nonfinite_origin(r.host_x, model_)));
    }
    op_profile_mark("step: loss");
    r.loss.backward();
    op_profile_mark("step: end of backward (after the unit sums)");
  }
  if (opt_.after_gradients) opt_.after_gradients(step_ + 1, comm_.rank(), model_);
  update_part("codec", *optim_, params_, cfg_.optimizer, step_, schedule_.total_steps);
  return r;
}

// A GAN step (train/gan.h) is one of three sequences (warm-up, adversarial,
// and adversarial with a discriminator update): one captured graph each.
// Inside the step's exact scope.
void RankRun::gan_step(const Tensor& x, StepResult& r) {
  const int64_t step = step_ + 1;
  const bool updates = discriminator_updates(cfg_.gan, cfg_.run.seed, step);
  const bool adversarial = adversarial_step(cfg_.gan, step);
  note_step_variant("gan", adversarial + updates);
  if (updates) {
    const Tensor loss = gan_->discriminator_loss(x, r.out.reconstruction, comm_);
    health_->note(loss);
    gan_->learn(loss, step_, schedule_.total_steps);
    r.discriminator = loss.detach();
  }
  if (adversarial) {
    GanPart::CodecLosses losses = gan_->codec_losses(x, r.out.reconstruction, comm_);
    r.adversarial = losses.adversarial;
    r.feature = losses.feature;
    r.loss = add(r.loss, losses.total);
  }
}

// Why this run's steps cannot be one replayed step graph, "" where they
// can (engine/step_graph.h).
std::string RankRun::step_graph_refusal() const {
  if (device_.kind != Device::Kind::sim && device_.kind != Device::Kind::cuda) return "the CPU issues no launches";
  if (!cfg_.run.step_graphs) return "run.step_graphs is false";
  // The host backends (thread, mpi) run their collectives on sim as
  // launches of the step (comm/staging.h), and no graphed step runs a host
  // collective (engine/step_graph.h). A GPU's thread ranks stage their
  // collectives through the host; NCCL's, capturable themselves, are not
  // routed through the graph yet, nor its deadline watch (which waits on
  // events) kept out of the capture: GPU work, untested without one.
  if (comm_.world_size() > 1 && comm_.backend() == "nccl")
    return fmt::format("{} ranks (nccl): its collectives are not launches of the step yet", comm_.world_size());
  if (comm_.world_size() > 1 &&
      ((comm_.backend() != "thread" && comm_.backend() != "mpi") || device_.kind != Device::Kind::sim))
    return fmt::format("{} ranks ({}) on {}: a collective across ranks is not work of one stream", comm_.world_size(),
                       comm_.backend(), device_.str());
  if (opt_.after_gradients) return "a hook runs inside the step";
  if (opt_.profile) return "--profile times the step op by op";
  return "";
}

}  // namespace vqddp
