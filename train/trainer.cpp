#include "train/trainer.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <nlohmann/json.hpp>

#include "comm/agree.h"
#include "comm/batch_reduce.h"
#include "comm/backends.h"
#include "data/audio.h"
#include "engine/autograd.h"
#include "engine/device.h"
#include "engine/device_counters.h"
#include "engine/exact_batch.h"
#include "engine/gemm_floor.h"
#include "engine/core/file_io.h"
#include "engine/core/output_file.h"
#include "engine/op_profile.h"
#include "engine/ops.h"
#include "engine/optim.h"
#include "engine/step_graph.h"
#include "train/checkpoint.h"
#include "train/discriminators.h"
#include "train/gan.h"
#include "train/ddp.h"
#include "train/metrics_log.h"
#include "train/console.h"
#include "train/run_dir.h"
#include "train/run_identity.h"
#include "train/batch_prefetch.h"
#include "train/run_record.h"
#include "train/schedule.h"
#include "train/spectral.h"
#include "train/stoi.h"
#include "vq/code_stats.h"
#include "vq/index_columns.h"
#include "vq/perplexity.h"

namespace vqddp {

namespace {

// The run record's view of layer statistics (train/run_record.h).
std::vector<LayerUse> layer_use(const std::vector<LayerUsage>& usage) {
  std::vector<LayerUse> out;
  for (const LayerUsage& u : usage) out.push_back({u.perplexity, u.codes_used});
  return out;
}

using Clock = std::chrono::steady_clock;

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& o, std::vector<Tensor> params) {
  if (o.type == "sgd") return std::make_unique<Sgd>(std::move(params), SgdOptions{o.lr, o.momentum, o.weight_decay, false});
  return std::make_unique<AdamW>(std::move(params), AdamWOptions{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay});
}

// Per-layer code histograms of indices (M, Q) on any device, appended to
// `out` (sizes[l] floats per layer; -1 entries are skipped).
void append_histograms(const Tensor& indices, const std::vector<int64_t>& sizes, std::vector<float>& out) {
  int64_t m = indices.size(0), q = indices.size(1);
  size_t base = out.size();
  for (int64_t k : sizes) out.resize(out.size() + k, 0.f);
  Tensor host = indices.to(Device::cpu());
  const int64_t* pi = host.data<int64_t>();
  for (int64_t i = 0; i < m; ++i) {
    size_t at = base;
    for (int64_t l = 0; l < q; ++l) {
      int64_t c = pi[i * q + l];
      VQDDP_CHECK(c < sizes[l], "index {} of layer {} outside its codebook of {}", c, l, sizes[l]);
      if (c >= 0) out[at + c] += 1.f;
      at += sizes[l];
    }
  }
}

std::vector<LayerUsage> usage_of(const float* hist, const std::vector<int64_t>& sizes) {
  std::vector<LayerUsage> out;
  for (int64_t k : sizes) {
    LayerUsage u;
    u.codebook_size = k;
    u.perplexity = perplexity(hist, k);
    for (int64_t c = 0; c < k; ++c) u.codes_used += hist[c] > 0;
    out.push_back(u);
    hist += k;
  }
  return out;
}

// What a progress line shows, from the last step of a logging interval.
struct StepLog {
  double loss = 0, recon = 0, quantizer = 0;  // means over the global batch
  std::optional<double> discriminator, adversarial, feature;  // a GAN step's (train/gan.h)
  int64_t revived = 0;
  std::vector<LayerUsage> usage;
};

// Reads a logged step's numbers: the only place a training step waits for
// the device (docs/devices.md, "Transfers"). The losses are the global batch's
// already (an exact step's means are global on every rank): one read each.
// The code usage comes from the codebooks' own global counts
// (CodebookMetrics: one read per layer), or, for quantizers without per-layer
// codebooks (FSQ, a shared codebook), from the layers' indices counted on
// the device, all-reduced together (whole counts: exact in any order) and
// read once per layer. Every rank gets the same numbers, so a non-finite
// loss or a flagged row throws on every rank alike.
StepLog step_log(const ModelOutput& out, const Tensor& loss, const std::vector<Tensor>& adversarial,
                 const std::vector<int64_t>& sizes, Communicator& comm) {
  NoGradGuard no_grad;
  const Device dev = loss.device();
  StepLog log;
  std::vector<Tensor> parts{reshape(loss, {1}), reshape(out.reconstruction_loss, {1}), reshape(out.quantizer_loss, {1})};
  for (const Tensor& t : adversarial) parts.push_back(reshape(t.detach(), {1}));
  const std::vector<float> losses = concat(parts).to_vector<float>();
  log.loss = losses[0];
  log.recon = losses[1];
  log.quantizer = losses[2];
  // adversarial: a GAN step's {adversarial, feature matching[, discriminators]}.
  if (adversarial.size() >= 2) log.adversarial = losses[3], log.feature = losses[4];
  if (adversarial.size() == 3) log.discriminator = losses[5];
  std::vector<CodebookMetrics> layers;
  for (const CodebookMetrics& m : out.metrics) log.revived += m.codes_revived();
  if (out.metrics.size() == sizes.size()) {
    layers = out.metrics;
  } else {
    std::vector<Tensor> columns = split_columns(out.indices), stats;
    std::vector<StatsLayout> layouts;
    for (size_t l = 0; l < sizes.size(); ++l) {
      layouts.push_back({sizes[l], 0, comm.world_size()});
      Tensor none = empty({columns[l].size(0), 0}, DType::f32, dev);  // counts only
      stats.push_back(code_stats(none, columns[l], layouts.back(), comm.rank()));
    }
    Tensor all = concat(stats);
    comm.all_reduce(all, ReduceOp::sum);
    for (size_t l = 0, at = 0; l < sizes.size(); at += layouts[l].size(), ++l)
      layers.push_back(CodebookMetrics::on_device(slice_rows(all, at, at + layouts[l].size()), layouts[l]));
  }
  for (size_t l = 0; l < sizes.size(); ++l)
    log.usage.push_back({layers[l].perplexity(), layers[l].codes_used(), sizes[l]});
  if (!std::isfinite(log.loss))
    VQDDP_THROW_NONFINITE("the loss of the global batch is not finite ({})", log.loss);
  return log;
}

// Room for a checkpoint's header and metadata (the config JSON, checksums)
// next to its tensors' bytes, when checking a run directory's free space.
constexpr int64_t kCheckpointHeaderBytes = 1 << 20;

// Where a non-finite value met in the forward pass came from: the batch
// itself, or the model (the first non-finite parameter, if one is).
std::string nonfinite_origin(const Tensor& host_batch, const CodecModel& model) {
  if (int64_t at = first_nonfinite(host_batch); at >= 0)
    return fmt::format("the data batch itself holds a non-finite value (row {} of this rank's share)",
                       at / host_batch.size(1));
  float largest = 0;
  std::string largest_name;
  for (const auto& [name, p] : model.named_parameters()) {
    Tensor h = p.detach().to(Device::cpu());
    if (std::string bad = value_range_violation(h, {}); !bad.empty())
      return fmt::format("the data batch is finite; parameter '{}' holds {} (the updates diverged: a smaller "
                         "optimizer.lr or grad_clip may help)", name, bad);
    for (int64_t i = 0; i < h.numel(); ++i)
      if (std::fabs(h.data<float>()[i]) > largest) largest = std::fabs(h.data<float>()[i]), largest_name = name;
  }
  return fmt::format("the data batch and every parameter are finite, but the forward pass overflowed float32 "
                     "(largest parameter value {:.3g} in '{}': the updates diverged, a smaller optimizer.lr or "
                     "grad_clip may help)", largest, largest_name);
}

// Throws on every rank alike when any rank met a non-finite loss in the
// steps (checked, done]: the ranks' health flags (NaN once a loss was not
// finite) are summed, then read (one read). Before a log, a validation or a
// checkpoint, so a diverged model is never written.
void check_health(const Tensor& health, Communicator& comm, int64_t checked, int64_t done, const Tensor& host_batch,
                  const CodecModel& model) {
  Tensor all = reshape(health.detach(), {1}).clone();
  comm.all_reduce(all, ReduceOp::sum);
  if (std::isfinite(all.item<float>())) return;
  bool mine = !std::isfinite(health.item<float>());
  VQDDP_THROW_NONFINITE_EVERY_RANK("a training loss was not finite at a step in ({}, {}]{}; nothing after step {} is written; {}",
                        checked, done, mine ? fmt::format(" on rank {}", comm.rank()) : " on another rank", checked,
                        nonfinite_origin(host_batch, model));
}

std::string duration(double s) {
  if (s >= 3600) return fmt::format("{}h{:02}m", int(s) / 3600, int(s) % 3600 / 60);
  if (s >= 60) return fmt::format("{}m{:02}s", int(s) / 60, int(s) % 60);
  return fmt::format("{:.0f}s", s);
}

struct Validation {
  double mse = 0, snr_db = 0;
  double log_mel = -1;  // log-mel L1 distance (audio; -1 for images)
  double stft_distance = -1;  // multi-resolution STFT distance (audio; -1 for images)
  double stoi = -1;  // STOI (train/stoi.h), the mean over chunks long enough for it (audio; -1 for images or none)
  int64_t skipped = 0;  // held-out rows passed over (data.bad_files "skip"), all ranks
  std::vector<LayerUsage> usage;
  std::vector<float> histogram;  // every layer's code counts, layer after layer
};

// Eval mode, no grad: no module issues a collective; one all_reduce agrees
// that every rank's chunks went well (comm/agree.h), one reduce_units sums
// them, one all_reduce the code counts. The validation set is cut into
// chunks of about kChunkValues input floats (kChunkValues / F examples)
// fixed by position, each rank taking
// whole chunks: a rank's memory is bounded by a chunk's, whatever the
// held-out set's size. A chunk's sums (and its log-mel
// windows, over its frames laid end to end) depend on its examples alone,
// and the chunks' sums are added in chunk order, so every number is the
// same on any number of ranks.
Validation validate(CodecModel& model, const Dataset& data, Communicator& comm, Device device, int64_t done) {
  NoGradGuard no_grad;
  model.eval();
  // 2^16 values (41 frames of 1600 samples): W ranks validate their chunks
  // each in its own phase, so the process holds up to W chunks' working
  // sets at once, and the more chunks they run, the nearer their peaks
  // meet. At 2^18 a chunk of the main job held some 35 MiB per rank and its
  // peak RSS rose 1.20x from 20 to 200 held-out clips on 4 thread ranks
  // (bench_validation_memory); at 2^16 a chunk holds about what a training
  // step does, and the peak stays flat.
  constexpr int64_t kChunkValues = int64_t{1} << 16;
  const int64_t kChunk = std::max<int64_t>(1, kChunkValues / data.example_dim);
  const int64_t rows = data.validation.rows(), chunks = (rows + kChunk - 1) / kChunk;
  std::vector<int64_t> rank_chunks = even_shards(chunks, comm.world_size());
  int64_t first = shard_begin(rank_chunks, comm.rank());
  std::vector<int64_t> sizes = model.layer_sizes();
  int64_t codes = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  // Audio: the log-mel L1 distance of 32 ms windows (hop 8 ms, 40 mels) over
  // each chunk's frames laid end to end, which are consecutive samples of
  // the held-out clips whatever data.frame is, so the MLP's 40-sample
  // frames and the conv codec's segments are measured alike.
  const bool audio = data.examples_per_second > 0;
  const double rate = data.examples_per_second * static_cast<double>(data.example_dim);
  std::optional<LogMel> mel;
  if (audio) mel.emplace(held_out_log_mel(rate));
  // And the multi-resolution STFT distance, at the STFT loss's resolutions.
  std::vector<Stft> stfts;
  if (audio)
    for (auto [n_fft, hop] : kStftLossResolutions) stfts.emplace_back(n_fft, hop);
  // Per chunk: sum x^2, sum err^2, elements, log-mel sum and count, rows
  // skipped (data.bad_files "skip"), each STFT resolution's distance sum and
  // count, the chunk's STOI and 1 (or 0 and 0 when the chunk is too short
  // or too quiet for one STOI segment: its mean is over the chunks that have
  // one). The code histogram of every layer is counted per rank and summed
  // by one all_reduce of integers (exact in any order): as a chunk's columns
  // it made each chunk's row 4 KiB for the main job, kept until the end, so
  // a rank's memory grew with the held-out set.
  constexpr int64_t kStftAt = 6, kStoiAt = kStftAt + 2 * static_cast<int64_t>(kStftLossResolutions.size());
  constexpr int64_t kFixed = kStoiAt + 2;
  const int64_t width = kFixed;
  std::vector<float> packed, chunk_histogram;
  std::vector<int64_t> histogram(static_cast<size_t>(codes), 0);
  Validation v;
  // A chunk that fails on one rank (a non-finite reconstruction, say)
  // fails every rank here, not in reduce_units at their timeout.
  agree_on(comm, true, [&] {
    for (int64_t c = first; c < first + rank_chunks[comm.rank()]; ++c) {
      Tensor x;  // (n, F)
      int64_t skipped = 0;
      try {
        x = data.validation.read_range(c * kChunk, std::min(rows, (c + 1) * kChunk), data.skip_bad_rows, &skipped);
      } catch (const Error& e) {
        VQDDP_THROW("validation at step {}: reading held-out rows {} to {}: {}", done, c * kChunk, std::min(rows, (c + 1) * kChunk),
                   e.what());
      }
      ModelOutput out = model.forward(x.to(device), comm);
      Tensor y = out.reconstruction.to(Device::cpu());  // (n, F)
      // x and y are on the host: the measures take them as the chunk's one
      // row laid end to end, with no copy.
      const float *px = x.data<float>(), *py = y.data<float>();
      SumCount mel_l1;
      if (mel && x.numel() >= 256) mel_l1 = log_mel_l1_against(*mel, mel->host(px, x.numel()), py, x.numel());
      double signal = 0, error = 0;
      for (int64_t i = 0; i < x.numel(); ++i) {
        signal += double(px[i]) * px[i];
        error += (double(px[i]) - py[i]) * (double(px[i]) - py[i]);
      }
      std::vector<float> row{static_cast<float>(signal), static_cast<float>(error), static_cast<float>(x.numel()),
                             static_cast<float>(mel_l1.sum), static_cast<float>(mel_l1.count),
                             static_cast<float>(skipped)};
      for (size_t r = 0; r < kStftLossResolutions.size(); ++r) {
        SumCount d;
        if (audio && x.numel() >= kStftLossResolutions.back().first)
          d = stft_distance_against(stfts[r], stft_reference(stfts[r], px, x.numel()), py, x.numel());
        row.insert(row.end(), {static_cast<float>(d.sum), static_cast<float>(d.count)});
      }
      std::optional<double> intelligibility;
      if (audio) try {
          intelligibility = stoi_if_scorable(std::vector<float>(px, px + x.numel()),
                                             std::vector<float>(py, py + y.numel()), static_cast<int>(std::lround(rate)));
        } catch (const Error& e) {
          VQDDP_THROW("validation at step {}: STOI of held-out rows {} to {}: {}", done, c * kChunk,
                      std::min(rows, (c + 1) * kChunk), e.what());
        }
      row.insert(row.end(), {static_cast<float>(intelligibility.value_or(0)), intelligibility ? 1.f : 0.f});
      chunk_histogram.clear();
      append_histograms(out.indices, sizes, chunk_histogram);
      for (int64_t i = 0; i < codes; ++i) histogram[i] += static_cast<int64_t>(chunk_histogram[i]);
      packed.insert(packed.end(), row.begin(), row.end());
    }
  });
  Tensor mine = from_vector(packed, {rank_chunks[comm.rank()], width});
  Tensor t = empty({width});
  comm.reduce_units(mine, rank_chunks, t);
  Tensor counts = from_vector(histogram, {codes});
  if (codes > 0) comm.all_reduce(counts, ReduceOp::sum);
  const float* p = t.data<float>();
  v.mse = p[2] > 0 ? p[1] / p[2] : 0;
  v.snr_db = p[1] > 0 ? 10 * std::log10(double(p[0]) / p[1]) : 0;
  if (audio) v.log_mel = p[4] > 0 ? p[3] / p[4] : 0;
  if (audio) {
    v.stft_distance = 0;
    const size_t res = kStftLossResolutions.size();
    for (size_t r = 0; r < res; ++r)
      v.stft_distance += p[kStftAt + 1 + 2 * r] > 0 ? p[kStftAt + 2 * r] / p[kStftAt + 1 + 2 * r] / static_cast<double>(res) : 0;
    if (p[kStoiAt + 1] > 0) v.stoi = p[kStoiAt] / p[kStoiAt + 1];
  }
  v.skipped = static_cast<int64_t>(p[5]);
  const int64_t* total = counts.data<int64_t>();
  v.histogram.assign(total, total + codes);
  v.usage = usage_of(v.histogram.data(), sizes);
  model.train();
  return v;
}

// The device a rank trains on: the communicator's GPU when it has one (an
// nccl rank's own GPU, whatever run.device says); else cuda:0 for
// run.device "cuda" (all thread ranks share it; the thread backend stages
// their collectives through the host), "sim" (the simulated device, which
// counts every transfer: engine/device_counters.h) or "cpu".
Device rank_device(const Communicator& comm, const RunConfig& run) {
  if (!comm.device().is_cpu()) return comm.device();
  return parse_device(run.device, "run.device");
}

// Refuses, before anything is trained or written, a device this run cannot
// use, with a message that says why.
void check_device(Device device) {
  if (device.kind != Device::Kind::cuda) return;
  int gpus = cuda_device_count();
  VQDDP_CHECK(gpus > device.index, "run.device is cuda but {}",
              !cuda_built() ? "this vqddp was built without CUDA (meson -Dcuda=enabled needs the CUDA toolkit)"
              : gpus == 0   ? "this machine has no CUDA device"
                            : fmt::format("this machine has no {} ({} CUDA devices)", device.str(), gpus));
}

// This rank's device, refused before anything is built if it cannot be used.
Device usable_rank_device(const Communicator& comm, const RunConfig& run) {
  Device device = rank_device(comm, run);
  check_device(device);
  return device;
}

// One rank's run, step by step: train() starts one per rank and each
// rank runs its own. The members are what lives for the whole run; the
// methods are the steps of the loop, in the order run() calls them.
class RankRun {
 public:
  RankRun(const Config& cfg, const Dataset& data, const TrainOptions& opt, Communicator& comm,
          const std::vector<int64_t>& sizes, uint32_t fingerprint)
      : cfg_(cfg),
        data_(data),
        opt_(opt),
        comm_(comm),
        sizes_(sizes),
        lead_(comm.rank() == 0),
        device_(usable_rank_device(comm, cfg.run)),
        dir_(cfg.run.dir),
        model_(cfg.model, cfg.quantizer, data.example_dim, cfg.run.seed, static_cast<double>(data.sample_rate)) {
    // On the device before anything keeps state next to the parameters: the
    // optimizer's moments and DDP's gradient buckets are allocated there.
    model_.to(device_);
    params_ = model_.parameters();  // listed once: the names are built per call
    optim_ = make_optimizer(cfg.optimizer, params_);
    if (cfg.gan.enabled) {
      disc_ = std::make_unique<Discriminators>(cfg.gan, data.example_dim, static_cast<double>(data.sample_rate),
                                               cfg.run.seed);
      disc_->to(device_);
      disc_params_ = disc_->parameters();
      disc_optim_ = make_optimizer(cfg.gan.optimizer, disc_params_);
      disc_state_.emplace(DiscriminatorState{*disc_, *disc_optim_});
    }
    // The same build and config on every rank (ranks on other nodes may
    // differ), then the data and the schedule. The schedule's length bounds
    // the step a checkpoint may resume at.
    agree_run_identity(comm, build_fingerprint(), config_fingerprint(cfg.source));
    schedule_ = agree_schedule(sizes_, data.weights, cfg.schedule, comm, fingerprint);
    // Loaded before DDP's start-up broadcast, which then makes every rank's
    // state rank 0's (a resumed one included).
    step_ = opt.resume.empty() ? 0
                               : load_checkpoint(opt.resume, model_, *optim_, schedule_.total_steps, &cfg.source,
                                                 discriminator());
    open_run_dir();
    step_ = agree_start_step(step_, comm);
    last_ = opt.stop_at_step > 0 ? std::min(opt.stop_at_step, schedule_.total_steps) : schedule_.total_steps;
    layer_sizes_ = model_.layer_sizes();
    capture_check_ = device_.kind == Device::Kind::sim;
  }

  // The loop: from the start step to the last (or a stop every rank agreed
  // on), then what rank 0 reports.
  void run(TrainResult& result, std::mutex& result_mu) {
    broadcast_parameters(model_, comm_);  // exact steps reduce gradients in backward(): no DDP object
    if (disc_) broadcast_parameters(*disc_, comm_);  // the discriminators start as rank 0's too
    ShardedSampler sampler(schedule_, sizes_, cfg_.run.seed, comm_.rank(), comm_.world_size(), opt_.rank_units);
    BatchPrefetcher batches(data_, sampler, step_, last_, data_.prefetch, data_.readers);
    print_start();
    loop_start_ = Clock::now();
    first_ = step_;
    checked_ = step_;
    health_ = zeros({}, DType::f32, device_);
    model_.train();
    // Made on this thread, which runs the steps (a step graph is per thread).
    std::optional<StepGraph> graph;
    if (const std::string why = step_graph_refusal(); why.empty())
      graph.emplace(device_);
    else if (lead_ && opt_.print && (!device_.is_cpu() || (cfg_.run.step_graphs_given && cfg_.run.step_graphs)))
      progress("train: step graphs off: {}\n", why);  // on the CPU only when asked for: they are never on there
    for (; step_ < last_ && !stopped_by_ && !disk_low_at_; ++step_) {
      std::optional<LaunchRecording> recording;
      if (capture_check_) recording.emplace();
      // After the warm-up (k-means, the optimizer's first step, the capture
      // check's first comparison), every step is the captured one again.
      const bool graphed = graph && step_ >= first_ + 2;
      if (graphed) graph->begin_step(step_ + 1);
      StepResult r;
      const int64_t flops_before = device_counters().flops;
      try {
        r = train_step(sampler, batches);
        step_flops_ += device_counters().flops - flops_before;
      } catch (...) {
        if (graphed) graph->abandon_step();
        throw;
      }
      if (graphed) {
        graph->end_step();
        graph_replays_ = graph->replays();
        const bool says = lead_ && opt_.print;
        if (!graph->stopped_because().empty()) {
          if (says) progress("train: step graphs off from step {}: {}\n", step_ + 2, graph->stopped_because());
          graph.reset();
        } else if (says && step_ == first_ + 2) {
          progress("train: step graphs on: step {} captured ({} launches), every later step is its replay\n",
                   step_ + 1, graph->launches());
        }
      }
      const int64_t done = step_ + 1;
      if (recording) {
        check_capturable(std::move(recording->launches), recording->variant, done);
        recording.reset();
      }
      if (opt_.after_step) opt_.after_step(done, comm_.rank(), model_, *optim_, discriminator());
      agree_on_stop(done);
      const bool logs = schedule_.log_after(done) || done == last_ || stopped_by_;
      bool validates = opt_.validate && schedule_.validate_after(done) && !stopped_by_;
      bool saves = opt_.checkpoints && (schedule_.checkpoint_after(done) || done == last_ || stopped_by_);
      if (logs || validates || saves) {
        // A disk nearly full: this step is saved into the reserve's room and
        // the run stops (after the loop), every rank alike.
        if (agree_disk_low()) {
          disk_low_at_ = done;
          saves = opt_.checkpoints;
          validates = false;  // its clips would take the room the checkpoint needs
        }
        // A read that failed since the last check (train_step): every rank
        // stops here with the error, naming the file and the step.
        agree_outcome(comm_, read_failure_.empty() ? "" : read_failure_ + fmt::format("; nothing after step {} is "
                      "written", checked_));
        check_health(health_, comm_, checked_, done, r.host_x, model_);
        checked_ = done;
      }
      if (logs) log_step(done, r);
      if (validates) validate_and_log(done);
      if (saves) save(done);
    }
    // No rank returns (and exits, under a launcher) before rank 0's
    // checkpoint of the stop is on disk: a launcher that saw one process
    // end would signal the others, and a second signal stops at once.
    if (stopped_by_) comm_.barrier();
    if (disk_low_at_) stop_for_disk();
    if (opt_.profile) gather_and_print_profile();
    if (lead_) report(result, result_mu);
  }

 private:
  // The last step of each variant (LaunchRecording::variant), for
  // check_capturable: which step it was, and what it launched.
  std::map<std::string, std::pair<int64_t, std::vector<LaunchRecord>>> previous_launches_;
  // On sim, for every run (check_capturable).
  bool capture_check_ = false;
  // Steps run as a replay of the captured step graph (run()).
  int64_t graph_replays_ = 0;
  // The FLOPs of this rank's training steps since the run started
  // (engine/kernel_flops.h), and with --profile rank 0's figures against
  // the GEMM floor (gather_and_print_profile).
  int64_t step_flops_ = 0;
  TrainResult::Profile profile_;
  // Rows this rank's batches passed over (data.bad_files "skip"), since the run started.
  int64_t skipped_rows_ = 0;
  // The first error reading this rank's rows since the run started (train_step).
  std::string read_failure_;

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

  // 0 while every loss of this rank was finite, NaN from the first one that
  // was not (loss - loss is 0 or NaN; the sum keeps a NaN).
  // In place: a captured step graph replays writes into the same buffer.
  void note_health(const Tensor& loss) { health_.copy_(add(health_, sub(loss.detach(), loss.detach()))); }

  // Why this run's steps cannot be one replayed step graph, "" where they
  // can (engine/step_graph.h).
  std::string step_graph_refusal() const {
    if (device_.kind != Device::Kind::sim && device_.kind != Device::Kind::cuda) return "the CPU issues no launches";
    if (!cfg_.run.step_graphs) return "run.step_graphs is false";
    if (comm_.world_size() > 1)
      return fmt::format("{} ranks ({}): a collective across ranks is not work of one stream", comm_.world_size(),
                         comm_.backend());
    if (opt_.after_gradients) return "a hook runs inside the step";
    if (opt_.profile) return "--profile times the step op by op";
    return "";
  }

  const DiscriminatorState* discriminator() const { return disc_state_ ? &*disc_state_ : nullptr; }

  // --profile, on every rank (the world's FLOPs are a gather): rank 0's
  // table, op by op, and how far the world's steps are from the GEMM
  // floor: its FLOPs per step at the floor's speed against rank 0's time
  // per step (every rank waits for the others at each step's collectives).
  void gather_and_print_profile() {
    int64_t world_flops = 0;
    for (const std::vector<int64_t>& v : gather_values(comm_, {step_flops_})) world_flops += v[0];
    if (!lead_) return;
    const int64_t steps = std::max<int64_t>(step_ - first_, 1);
    std::vector<OpProfileEntry> entries = op_profile_take();
    double seconds = 0;
    for (const OpProfileEntry& e : entries) seconds += e.seconds;
    profile_ = {.gflop_per_step = static_cast<double>(world_flops) / steps / 1e9,
                .seconds_per_step = seconds / steps,
                .gemm_floor = opt_.gemm_floor};
    if (!opt_.print) return;
    const ProfileFloor floor{opt_.gemm_floor, world_flops > 0 ? static_cast<double>(step_flops_) / world_flops : 1.0};
    progress("profile of {} training steps, rank 0 of {} ({}):\n{}", step_ - first_, comm_.world_size(),
             device_.str(), op_profile_table(entries, step_ - first_, floor));
    progress("the world's step: {:.3f} GFLOP (rank 0: {:.3f}) in {:.2f} ms, {:.1f} GFLOP/s: {:.1f}% of the GEMM "
             "floor ({:.1f} GFLOP/s)\n", profile_.gflop_per_step, static_cast<double>(step_flops_) / steps / 1e9,
             profile_.seconds_per_step * 1e3, profile_.gflop_per_step / profile_.seconds_per_step,
             100 * profile_.floor_share(), opt_.gemm_floor);
  }

  // Step 2 of a GAN step (train/gan.h): the discriminators learn to tell x
  // from the codec's y (detached), inside the step's exact scope, so their
  // gradients are the global batch's on every rank.
  // Returns their loss (detached).
  Tensor discriminator_step(const Tensor& x, const Tensor& y) {
    Tensor loss;
    {
      WeightNormBatch weights(*disc_);
      std::vector<DiscriminatorOutput> real = disc_->forward(x), fake = disc_->forward(y.detach());
      loss = discriminator_loss(real, fake, cfg_.gan.loss, comm_);
    }
    note_health(loss);
    loss.backward();
    op_profile_mark("step: discriminator backward");
    disc_optim_->lr = learning_rate(cfg_.gan.optimizer, step_, schedule_.total_steps);
    if (cfg_.gan.optimizer.grad_clip > 0) clip_grad_norm(disc_params_, cfg_.gan.optimizer.grad_clip);
    disc_optim_->step();
    disc_optim_->zero_grad();
    op_profile_mark("step: discriminator optimizer");
    return loss.detach();
  }

  // Step 3's losses: the (updated) discriminators on x, with no graph (only
  // the features' scale and targets are needed), and on y, whose gradient
  // reaches the codec alone: their parameters are frozen for this pass, so
  // backward computes no weight gradient for them and reduces none.
  void adversarial_losses(const Tensor& x, const Tensor& y, StepResult& r) {
    struct Frozen {
      std::vector<Tensor>& params;
      explicit Frozen(std::vector<Tensor>& p) : params(p) { for (Tensor& t : params) t.set_requires_grad(false); }
      ~Frozen() { for (Tensor& t : params) t.set_requires_grad(true); }
    } frozen(disc_params_);
    WeightNormBatch weights(*disc_);
    std::vector<DiscriminatorOutput> real;
    {
      NoGradGuard no_grad;
      real = disc_->forward(x);
    }
    std::vector<DiscriminatorOutput> fake = disc_->forward(y);
    r.adversarial = generator_loss(fake, cfg_.gan.loss, comm_);
    r.feature = feature_matching_loss(real, fake, comm_);
    r.loss = add(r.loss, add(mul(r.adversarial, static_cast<float>(cfg_.gan.adversarial_weight)),
                             mul(r.feature, static_cast<float>(cfg_.gan.feature_weight))));
    op_profile_mark("step: adversarial losses");
  }

  // The run directory is checked, and the metrics file opened (cut back to
  // the resumed step), before any step is trained; temporaries of a save
  // killed midway go before this run writes its first checkpoint. Rank 0's
  // alone, but every rank learns how it went (comm/agree.h): a refused
  // directory stops them all at once, not at their timeout.
  void open_run_dir() {
    agree_on(comm_, lead_ && (opt_.checkpoints || opt_.print), [&] {
      int64_t bytes = kCheckpointHeaderBytes;
      for (const auto& [name, t] : checkpoint_tensors(model_, *optim_, discriminator())) bytes += t.nbytes();
      run_dir_.emplace(dir_.string(), bytes,
                       !opt_.resume.empty() ? RunStart::resume
                       : opt_.overwrite     ? RunStart::overwrite
                                            : RunStart::fresh,
                       opt_.checkpoints);
      // The first checkpoint save would sweep these too (engine/core/output_file.h);
      // at the start, a killed save's half checkpoint frees its disk before the run.
      if (opt_.checkpoints) remove_stale_temporaries((dir_ / "checkpoint.safetensors").string());
      if (opt_.print) metrics_.emplace((dir_ / "metrics.jsonl").string(), opt_.resume.empty() ? -1 : step_);
    });
  }

  void print_start() {
    if (!lead_ || !opt_.print) return;
    progress("train: {} | {} ranks ({}, {}) | {} steps of {} examples ({} per epoch) | {:.0f} bits per example{}\n",
             data_.description, comm_.world_size(), comm_.backend(), device_.str(), schedule_.total_steps,
             schedule_.batch_size, schedule_.steps_per_epoch, model_.bits_per_example(),
             data_.examples_per_second > 0
                 ? fmt::format(" = {:.2f} kbit/s", model_.bits_per_example() * data_.examples_per_second / 1000)
                 : "");
    if (step_ > 0) progress("train: resumed at step {} from {}\n", step_, opt_.resume);
    // What `vqddp report` says of the run beside its metrics.
    RunFacts run;
    run.description = data_.description;
    run.backend = comm_.backend();
    run.device = device_.str();
    run.world_size = comm_.world_size();
    run.total_steps = schedule_.total_steps;
    run.bits_per_example = model_.bits_per_example();
    run.bitrate = model_.bits_per_example() * data_.examples_per_second;
    run.sample_rate = data_.sample_rate;
    run.example_dim = data_.example_dim;
    run.layer_sizes = layer_sizes_;
    run.config = cfg_.source;
    report_artefact("run.json", [&] { write_file_atomic((dir_ / "run.json").string(), to_json(run).dump(2)); });
  }

  // Forward, backward, clipping and the optimizer step of step_ + 1.
  // The capture check, on sim: after the run's first step (k-means, the
  // allocator's warm-up), every step must launch what the last step of its
  // variant launched, kernel for kernel on the same sizes, or a CUDA graph
  // captured from one step could not replay the next. A step has one
  // variant unless a host-side draw picks among a few sequences
  // (quantize dropout's number of layers: one graph each). Refused by name,
  // so CI proves every shipped example's step capturable without a GPU.
  void check_capturable(std::vector<LaunchRecord> launches, const std::string& variant, int64_t done) {
    auto before = previous_launches_.find(variant);
    if (done >= first_ + 3 && before != previous_launches_.end() && before->second.first >= first_ + 2) {
      std::string diff = launch_sequence_difference(before->second.second, launches);
      VQDDP_CHECK(diff.empty(), "capture check ({}): step {} launched another sequence than step {} on rank {}{}: {}",
                  device_.str(), done, before->second.first, comm_.rank(),
                  variant.empty() ? "" : fmt::format(" (variant {})", variant), diff);
    }
    previous_launches_[variant] = {done, std::move(launches)};
  }

  StepResult train_step(ShardedSampler& sampler, BatchPrefetcher& batches) {
    std::optional<OpProfileScope> profile;
    if (opt_.profile && lead_) profile.emplace(device_);
    StepResult r;
    // A rank that cannot read its rows (a file gone, changed or cut since
    // the start) trains this step on zeros and keeps the error, which every
    // rank raises at the next log, validation or checkpoint, before anything
    // is written (run()): no collective a step, so no wait for a GPU.
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
        // A GAN step is one of three sequences (warm-up, adversarial, and
        // adversarial with a discriminator update): one captured graph each.
        const int64_t step = step_ + 1;
        const bool updates = discriminator_updates(cfg_.gan, cfg_.run.seed, step);
        const bool adversarial = adversarial_step(cfg_.gan, step);
        if (disc_) note_step_variant("gan", adversarial + updates);
        if (updates) r.discriminator = discriminator_step(x, r.out.reconstruction);
        if (adversarial) adversarial_losses(x, r.out.reconstruction, r);
        // Kept on the device, read only where the run logs, validates or
        // writes a checkpoint, so a diverged step on a device never reaches
        // a checkpoint.
        note_health(r.loss);
      } catch (const NonFiniteError& e) {
        rethrow_nonfinite(e, fmt::format("step {}, rank {}: {}; {}", step_ + 1, comm_.rank(), e.what(),
                                         nonfinite_origin(r.host_x, model_)));
      }
      op_profile_mark("step: loss");
      r.loss.backward();
      op_profile_mark("step: end of backward (after the unit sums)");
    }
    optim_->lr = learning_rate(cfg_.optimizer, step_, schedule_.total_steps);
    if (opt_.after_gradients) opt_.after_gradients(step_ + 1, comm_.rank(), model_);
    if (cfg_.optimizer.grad_clip > 0) clip_grad_norm(params_, cfg_.optimizer.grad_clip);
    op_profile_mark("step: gradient clipping");
    optim_->step();
    optim_->zero_grad();
    op_profile_mark("step: optimizer");
    return r;
  }

  // A stop asked on any rank (SIGTERM), agreed by all: one all_reduce (max)
  // of the received signal. Not after the last step (every rank knows
  // last_, so all skip it): a stop asked then changes nothing, the run is
  // complete.
  // Whether rank 0's run directory is on a nearly full disk (RunDir::disk_low),
  // agreed by every rank (one all_reduce).
  // With the free bytes rank 0 saw, for the message every rank gives.
  bool agree_disk_low() {
    const bool low = lead_ && run_dir_ && run_dir_->disk_low();
    Tensor seen = from_vector(std::vector<int64_t>{low ? 1 : 0, low ? run_dir_->free_bytes() : -1}, {2});
    comm_.all_reduce(seen, ReduceOp::max);
    disk_free_ = seen.data<int64_t>()[1];
    return seen.data<int64_t>()[0] != 0;
  }

  // The stop for a full disk, on every rank alike, once the step's
  // checkpoint is saved: an error, so a batch script sees the run did not
  // end, naming the way on.
  [[noreturn]] void stop_for_disk() const {
    const int64_t free = disk_free_;
    const std::string checkpoint = (dir_ / "checkpoint.safetensors").string();
    throw AgreedError(fmt::format("run directory {}: its disk is nearly full{} at step {}: stopped early, the "
                                  "checkpoint of step {} is saved ({}); make room, then continue with: {}",
                                  dir_.string(), free >= 0 ? fmt::format(" ({} free)", mib(free)) : "", disk_low_at_,
                                  disk_low_at_, checkpoint,
                                  opt_.resume_hint.empty() ? "--resume " + checkpoint : opt_.resume_hint),
                      source_position(__FILE__, __LINE__));
  }

  void agree_on_stop(int64_t done) {
    if (!opt_.stop_requested || done >= last_) return;
    stop_flag_.data<int64_t>()[0] = opt_.stop_requested();
    comm_.all_reduce(stop_flag_, ReduceOp::max);
    stopped_by_ = static_cast<int>(stop_flag_.data<int64_t>()[0]);
  }

  void log_step(int64_t done, const StepResult& r) {
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
    const int64_t skipped_total = skipped.data<int64_t>()[0];
    if (!lead_ || !opt_.print) return;
    double secs = std::chrono::duration<double>(Clock::now() - loop_start_).count();
    double rate = (done - first_) / std::max(secs, 1e-9);
    std::string ppl, used;
    for (const LayerUsage& u : log.usage) {
      ppl += fmt::format("{}{:.0f}", ppl.empty() ? "" : "/", u.perplexity);
      used += fmt::format("{}{}", used.empty() ? "" : "/", u.codes_used);
    }
    std::string gan;
    if (log.discriminator) gan += fmt::format("  disc {:.4f}", *log.discriminator);
    if (log.adversarial) gan += fmt::format("  adv {:.4f}  feat {:.4f}", *log.adversarial, *log.feature);
    progress("step {:>6}/{}  loss {:.5f}  recon {:.5f}{}  ppl {}  used {}  revived {}{}  {:.1f} steps/s  ETA {}\n", done,
             schedule_.total_steps, log.loss, log.recon, gan, ppl, used, log.revived,
             skipped_total > 0 ? fmt::format("  skipped {}", skipped_total) : "", rate,
             duration((last_ - done) / std::max(rate, 1e-9)));
    TrainLine line{.step = done, .loss = log.loss, .recon = log.recon, .lr = optim_->lr, .steps_per_s = rate,
                   .quantizer = log.quantizer, .discriminator = log.discriminator, .adversarial = log.adversarial,
                   .feature = log.feature, .revived = log.revived, .layers = layer_use(log.usage),
                   .skipped_rows = skipped_total};
    metrics_->write(to_json(line));
  }

  void validate_and_log(int64_t done) {
    val_ = validate(model_, data_, comm_, device_, done);
    if (!lead_ || !opt_.print) return;
    progress("validation at step {}: mse {:.6f}  snr {:.2f} dB{}{}{}{}\n", done, val_.mse, val_.snr_db,
             val_.stoi >= 0 ? fmt::format("  STOI {:.3f}", val_.stoi) : "",
             val_.log_mel >= 0 ? fmt::format("  log-mel L1 {:.3f}", val_.log_mel) : "",
             val_.stft_distance >= 0 ? fmt::format("  MR-STFT {:.3f}", val_.stft_distance) : "",
             val_.skipped > 0 ? fmt::format("  skipped {}", val_.skipped) : "");
    const ValidationLine line{.step = done,
                              .mse = val_.mse,
                              .snr_db = val_.snr_db,
                              .log_mel_l1 = val_.log_mel >= 0 ? std::optional<double>(val_.log_mel) : std::nullopt,
                              .stft_distance =
                                  val_.stft_distance >= 0 ? std::optional<double>(val_.stft_distance) : std::nullopt,
                              .stoi = val_.stoi >= 0 ? std::optional<double>(val_.stoi) : std::nullopt,
                              .layers = layer_use(val_.usage),
                              .skipped_rows = val_.skipped};
    metrics_->write(to_json(line));
    report_artefact("code_usage.json", [&] { write_code_usage(done); });
    if (data_.sample_rate > 0) report_artefact("clips/", [&] { write_clips(); });
  }

  // What `vqddp report` reads beside the metrics is written by rank 0 alone,
  // outside any collective: a failure to write it (a full disk) must not stop
  // rank 0 while the others wait at their next collective, and matters less
  // than the checkpoint. Warned about, like a metrics line that could not be
  // written, and training goes on.
  void report_artefact(const char* what, const std::function<void()>& write) {
    try {
      write();
    } catch (const std::exception& e) {
      console_line(stderr, "vqddp: warning: {} in {} could not be written ({}); training goes on\n", what, dir_.string(),
                 e.what());
      model_.train();  // write_clips works in eval mode: back to training if it threw there
    }
  }

  // The code histogram of every layer at this validation, for `vqddp report`
  // (one file, replaced each time: only the last one is plotted).
  void write_code_usage(int64_t done) const {
    CodeUsage usage{.step = done, .counts = {}};
    const float* h = val_.histogram.data();
    for (int64_t k : layer_sizes_) {
      usage.counts.emplace_back(h, h + k);
      h += k;
    }
    write_file_atomic((dir_ / "code_usage.json").string(), to_json(usage).dump());
  }

  // Held-out audio to listen to: kClips stretches of about 2 s, evenly
  // spaced through the validation set, and the codec's output for them
  // (16-bit WAV in RUN_DIR/clips, replaced at each validation). Rank 0 alone,
  // in eval mode: no collective.
  void write_clips() {
    constexpr int64_t kClips = 4;
    const int64_t rows = data_.validation.rows(), f = data_.example_dim;
    const int64_t frames = std::min<int64_t>(rows / kClips, (2 * data_.sample_rate + f - 1) / f);
    if (frames == 0) return;
    const std::filesystem::path clips = run_subdir(dir_.string(), "clips");
    model_.eval();
    for (int64_t k = 0; k < kClips; ++k) {
      Tensor x = data_.validation.read_range(k * (rows / kClips), k * (rows / kClips) + frames,
                                             data_.skip_bad_rows);  // (frames, F)
      Tensor y = model_.decode(model_.encode(x.to(device_))).to(Device::cpu());
      const std::string stem = (clips / fmt::format("clip_{}_", k)).string();
      write_audio(stem + "original.wav", x.to_vector<float>(), static_cast<int>(data_.sample_rate), AudioEncoding::wav16);
      write_audio(stem + "decoded.wav", y.to_vector<float>(), static_cast<int>(data_.sample_rate), AudioEncoding::wav16);
    }
    model_.train();
  }

  // Rank 0 writes; every rank learns whether it could (a full disk stops
  // all of them here, not the others at their next collective's timeout).
  void save(int64_t done) {
    agree_on(comm_, lead_, [&] {
      // The reserve's room is the new checkpoint's until its rename (the
      // last checkpoint stays whole beside it); then it is taken again.
      if (run_dir_) run_dir_->release_reserve();
      save_checkpoint((dir_ / "checkpoint.safetensors").string(), model_, *optim_, done, schedule_.total_steps,
                      cfg_.source, data_facts(data_.example_dim, data_.sample_rate), discriminator());
      if (run_dir_ && done < last_) run_dir_->hold_reserve();  // if not, the next check stops the run
    });
  }

  void report(TrainResult& result, std::mutex& result_mu) const {
    std::lock_guard lock(result_mu);
    result.lead = true;
    result.steps = step_;
    result.stopped_by = stopped_by_;
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

  const Config& cfg_;
  const Dataset& data_;
  const TrainOptions& opt_;
  Communicator& comm_;
  const std::vector<int64_t>& sizes_;
  const bool lead_;
  const Device device_;
  const std::filesystem::path dir_;
  CodecModel model_;
  std::vector<Tensor> params_;
  std::unique_ptr<Optimizer> optim_;
  // A GAN run's discriminators and their optimizer (null without "gan").
  std::unique_ptr<Discriminators> disc_;
  std::vector<Tensor> disc_params_;
  std::unique_ptr<Optimizer> disc_optim_;
  std::optional<DiscriminatorState> disc_state_;
  Schedule schedule_;
  std::optional<RunDir> run_dir_;
  std::optional<MetricsLog> metrics_;
  std::vector<int64_t> layer_sizes_;
  int64_t step_ = 0;  // steps done
  int64_t last_ = 0;  // the step this run ends after
  int64_t first_ = 0;  // the step this process started at (for the speed)
  int64_t checked_ = 0;  // the last step the health was read at
  Clock::time_point loop_start_;
  Tensor health_;
  Validation val_;
  Tensor stop_flag_ = zeros({1}, DType::i64);  // the received signal, reused every step
  int stopped_by_ = 0;
  int64_t disk_low_at_ = 0;
  int64_t disk_free_ = -1;  // the bytes rank 0 saw free then (-1: unknown)  // the step the run stopped at for a nearly full disk (0: none)
};

}  // namespace

TrainResult train(const Config& cfg, const Dataset& data, const TrainOptions& opt) {
  TrainResult result;
  std::mutex result_mu;
  auto start = Clock::now();
  if (cfg.run.device == "cuda") check_device(Device::cuda(0));
  std::vector<int64_t> sizes;
  for (const DataRows& s : data.sources) sizes.push_back(s.rows());
  const uint32_t fingerprint = data_fingerprint(data);  // once, shared by the rank threads
  LaunchOptions launch{cfg.distributed.backend, cfg.distributed.world_size,
                       std::chrono::milliseconds(static_cast<int64_t>(cfg.distributed.timeout_s * 1000)),
                       cfg.distributed.check_collectives};
  // The floor before the ranks share the cores out (engine/gemm_floor.h).
  TrainOptions o = opt;
  if (o.profile && !(o.gemm_floor > 0)) o.gemm_floor = measure_gemm_floor(parse_device(cfg.run.device, "run.device"));
  launch_ranks(launch, [&](Communicator& comm) { RankRun(cfg, data, o, comm, sizes, fingerprint).run(result, result_mu); });
  result.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

}  // namespace vqddp
