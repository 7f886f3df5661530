#include "train/rank_run.h"

#include <fmt/format.h>

#include "comm/agree.h"
#include "engine/device.h"
#include "train/checkpoint.h"
#include "train/console.h"
#include "train/run_identity.h"

namespace vqddp {

namespace {

// The device a rank trains on: the communicator's GPU when it has one (an
// nccl rank's own GPU, whatever run.device says); else cuda:0 for
// run.device "cuda" (all thread ranks share it; the thread backend stages
// their collectives through the host), "sim" (the simulated device, which
// counts every transfer: engine/device_counters.h) or "cpu".
// Refused before anything is built if it cannot be used.
Device usable_rank_device(const Communicator& comm, const RunConfig& run) {
  const Device device = !comm.device().is_cpu() ? comm.device() : parse_device(run.device, "run.device");
  check_device(device);
  return device;
}

}  // namespace

void check_device(Device device) {
  if (device.kind != Device::Kind::cuda) return;
  int gpus = cuda_device_count();
  std::string unavailable = cuda_unavailable_reason();
  VQDDP_CHECK(gpus > device.index, "run.device is cuda but {}",
              !unavailable.empty() ? "CUDA cannot be used: " + unavailable
              : gpus == 0          ? "this machine has no CUDA device"
                                   : fmt::format("this machine has no {} ({} CUDA devices)", device.str(), gpus));
}

RankRun::RankRun(const Config& cfg, const Dataset& data, const TrainOptions& opt, Communicator& comm,
                 const std::vector<int64_t>& sizes, uint32_t fingerprint)
    : cfg_(cfg),
      data_(data),
      opt_(opt),
      comm_(comm),
      sizes_(sizes),
      lead_(comm.rank() == 0),
      device_(usable_rank_device(comm, cfg.run)),
      model_(cfg.model, cfg.quantizer, data.example_dim, cfg.run.seed, static_cast<double>(data.sample_rate)),
      records_(cfg, data, opt, comm, device_),
      stop_(opt, comm) {
  // On the device before anything keeps state next to the parameters: the
  // optimizer's moments are allocated there.
  model_.to(device_);
  params_ = model_.parameters();  // listed once: the names are built per call
  optim_ = make_optimizer(cfg.optimizer, params_);
  parts_.push_back({"codec", "", model_, *optim_});
  if (cfg.gan.enabled) {
    gan_ = std::make_unique<GanPart>(cfg.gan, data.example_dim, static_cast<double>(data.sample_rate), cfg.run.seed,
                                     device_);
    parts_.push_back(gan_->part());
  }
  // The same build and config on every rank (ranks on other nodes may
  // differ), then the data and the schedule. The schedule's length bounds
  // the step a checkpoint may resume at.
  agree_run_identity(comm, build_fingerprint(), config_fingerprint(cfg.source));
  schedule_ = agree_schedule(sizes_, data.weights, cfg.schedule, comm, fingerprint);
  // Loaded before the start-up broadcast, which then makes every rank's
  // state rank 0's (a resumed one included).
  step_ = opt.resume.empty() ? 0 : load_checkpoint(opt.resume, parts_, schedule_.total_steps, &cfg.source);
  records_.open(parts_, step_);
  step_ = agree_start_step(step_, comm);
  last_ = opt.stop_at_step > 0 ? std::min(opt.stop_at_step, schedule_.total_steps) : schedule_.total_steps;
  layer_sizes_ = model_.layer_sizes();
}

void RankRun::run(TrainResult& result, std::mutex& result_mu) {
  broadcast_parts(parts_, comm_);  // exact steps reduce gradients in backward(): no DDP object
  ShardedSampler sampler(schedule_, sizes_, cfg_.run.seed, comm_.rank(), comm_.world_size(), opt_.rank_units);
  BatchPrefetcher batches(data_, sampler, step_, last_, data_.prefetch, data_.readers);
  records_.print_start(model_, schedule_, step_);
  loop_start_ = Clock::now();
  first_ = step_;
  checked_ = step_;
  health_.emplace(device_);
  model_.train();
  // Made on this thread, which runs the steps (a step graph is per thread).
  std::optional<StepGraph> graph;
  if (const std::string why = step_graph_refusal(); why.empty())
    graph.emplace(device_);
  else if (lead_ && opt_.print && (!device_.is_cpu() || (cfg_.run.step_graphs_given && cfg_.run.step_graphs)))
    progress("train: step graphs off: {}\n", why);  // on the CPU only when asked for: they are never on there
  for (; step_ < last_ && !stop_.stopped_by() && !stop_.disk_low_at(); ++step_) {
    const StepResult r = graphed_step(graph, sampler, batches);
    const int64_t done = step_ + 1;
    if (opt_.after_step) opt_.after_step(StepView{done, comm_.rank(), model_, parts_});
    stop_.agree_on_signal(done, last_);
    checks_after(done, r);
  }
  // No rank returns (and exits, under a launcher) before rank 0's
  // checkpoint of the stop is on disk: a launcher that saw one process
  // end would signal the others, and a second signal stops at once.
  if (stop_.stopped_by()) comm_.barrier();
  if (stop_.disk_low_at()) stop_.stop_for_disk(records_.dir());
  if (opt_.profile) profile_ = records_.profile(step_flops_, step_ - first_);
  if (lead_) report(result, result_mu);
}

// Every decision here reads the schedule, the stop every rank agreed on and
// the steps done: every rank runs the same collectives.
void RankRun::checks_after(int64_t done, const StepResult& r) {
  const bool stopped = stop_.stopped_by() != 0;
  const bool logs = schedule_.log_after(done) || done == last_ || stopped;
  bool validates = opt_.validate && schedule_.validate_after(done) && !stopped;
  bool saves = opt_.checkpoints && (schedule_.checkpoint_after(done) || done == last_ || stopped);
  if (logs || validates || saves) {
    // A disk nearly full: this step is saved into the reserve's room and
    // the run stops (after the loop), every rank alike.
    if (stop_.agree_disk_low(records_.run_dir(), done)) {
      saves = opt_.checkpoints;
      validates = false;  // its clips would take the room the checkpoint needs
    }
    // A read that failed since the last check (train_step): every rank
    // stops here with the error, naming the file and the step.
    agree_outcome(comm_, read_failure_.empty() ? "" : read_failure_ + fmt::format("; nothing after step {} is "
                  "written", checked_));
    health_->check(comm_, checked_, done, r.host_x, model_);
    checked_ = done;
  }
  if (logs) log_step(done, r);
  if (validates) {
    val_ = validate(model_, data_, comm_, device_, done);
    records_.write_validation(done, val_, model_);
  }
  if (saves) records_.save(parts_, done, schedule_.total_steps, last_);
}

void RankRun::log_step(int64_t done, const StepResult& r) {
  StepLog log;
  try {
    // A GAN step past its warm-up: the codec's adversarial losses, and the
    // discriminators' if the step updated them.
    std::vector<Tensor> adversarial;
    if (r.adversarial.defined()) adversarial = {r.adversarial, r.feature};
    if (r.discriminator.defined()) adversarial.push_back(r.discriminator);
    log = step_log(r.out, r.loss, adversarial, layer_sizes_, comm_);
  } catch (const NonFiniteError& e) {
    rethrow_nonfinite(e, fmt::format("step {} (logged), rank {}: {}; {}", done, comm_.rank(), e.what(),
                                     nonfinite_origin(r.host_x, model_)));
  }
  // Rows skipped so far over all ranks (one all_reduce at a log step): the
  // 1-rank run's count, since every rank skips a row alike.
  Tensor skipped = from_vector(std::vector<int64_t>{skipped_rows_}, {1});
  comm_.all_reduce(skipped, ReduceOp::sum);
  const double secs = std::chrono::duration<double>(Clock::now() - loop_start_).count();
  records_.write_step(done, log, optim_->lr, (done - first_) / std::max(secs, 1e-9), skipped.data<int64_t>()[0],
                      schedule_.total_steps, last_);
}

void RankRun::report(TrainResult& result, std::mutex& result_mu) const {
  std::lock_guard lock(result_mu);
  result.lead = true;
  result.steps = step_;
  result.stopped_by = stop_.stopped_by();
  result.graph_replays = graph_replays_;
  result.profile = profile_;
  result.validation_mse = val_.mse;
  result.validation_snr_db = val_.snr_db;
  result.validation_log_mel = val_.log_mel;
  result.validation_stft_distance = val_.stft_distance;
  result.validation_stoi = val_.stoi;
  result.usage = val_.usage;
  result.bits_per_example = model_.bits_per_example();
  result.bitrate = model_.bits_per_example() * data_.examples_per_second;
}

}  // namespace vqddp
