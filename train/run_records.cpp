#include "train/run_records.h"

#include <fmt/format.h>

#include "comm/agree.h"
#include "data/audio.h"
#include "engine/core/output_file.h"
#include "engine/op_profile.h"
#include "engine/precision.h"
#include "train/checkpoint.h"
#include "train/console.h"
#include "train/run_record.h"

namespace vqddp {

namespace {

// Room for a checkpoint's header and metadata (the config JSON, checksums)
// next to its tensors' bytes, when checking a run directory's free space.
constexpr int64_t kCheckpointHeaderBytes = 1 << 20;

// The run record's view of layer statistics (train/run_record.h).
std::vector<LayerUse> layer_use(const std::vector<LayerUsage>& usage) {
  std::vector<LayerUse> out;
  for (const LayerUsage& u : usage) out.push_back({u.perplexity, u.codes_used});
  return out;
}

std::string duration(double s) {
  if (s >= 3600) return fmt::format("{}h{:02}m", int(s) / 3600, int(s) % 3600 / 60);
  if (s >= 60) return fmt::format("{}m{:02}s", int(s) / 60, int(s) % 60);
  return fmt::format("{:.0f}s", s);
}

std::optional<double> measured(double v) { return v >= 0 ? std::optional<double>(v) : std::nullopt; }

}  // namespace

RunRecords::RunRecords(const Config& cfg, const Dataset& data, const TrainOptions& opt, Communicator& comm,
                       Device device)
    : cfg_(cfg), data_(data), opt_(opt), comm_(comm), device_(device), lead_(comm.rank() == 0), dir_(cfg.run.dir) {}

void RunRecords::open(std::span<const TrainedPart> parts, int64_t step) {
  agree_on(comm_, lead_ && (opt_.checkpoints || opt_.print), [&] {
    int64_t bytes = kCheckpointHeaderBytes;
    for (const auto& [name, t] : checkpoint_tensors(parts)) bytes += t.nbytes();
    run_dir_.emplace(dir_.string(), bytes,
                     !opt_.resume.empty() ? RunStart::resume
                     : opt_.overwrite     ? RunStart::overwrite
                     : opt_.replace_unsaved ? RunStart::unsaved
                                          : RunStart::fresh,
                     opt_.checkpoints);
    // The first checkpoint save would sweep these too (engine/core/output_file.h);
    // at the start, a killed save's half checkpoint frees its disk before the run.
    if (opt_.checkpoints) remove_stale_temporaries((dir_ / "checkpoint.safetensors").string());
    if (opt_.print) metrics_.emplace((dir_ / "metrics.jsonl").string(), opt_.resume.empty() ? -1 : step);
  });
}

void RunRecords::print_start(const CodecModel& model, const Schedule& schedule, int64_t step) {
  if (!lead_ || !opt_.print) return;
  const double bitrate = model.bits_per_example() * data_.examples_per_second;
  progress("train: {} | {} ranks ({}, {}{}) | {} steps of {} examples ({} per epoch) | {:.0f} bits per example{}\n",
           data_.description, comm_.world_size(), comm_.backend(), device_.str(),
           product_precision() == Precision::fp32 ? "" : fmt::format(", {} products", precision_name(product_precision())),
           schedule.total_steps,
           schedule.batch_size, schedule.steps_per_epoch, model.bits_per_example(),
           data_.examples_per_second > 0 ? fmt::format(" = {:.2f} kbit/s", bitrate / 1000) : "");
  if (step > 0) progress("train: resumed at step {} from {}\n", step, opt_.resume);
  // What `vqddp report` says of the run beside its metrics.
  RunFacts run;
  run.description = data_.description;
  run.backend = comm_.backend();
  run.device = device_.str();
  run.world_size = comm_.world_size();
  run.total_steps = schedule.total_steps;
  run.bits_per_example = model.bits_per_example();
  run.bitrate = bitrate;
  run.sample_rate = data_.sample_rate;
  run.example_dim = data_.example_dim;
  run.layer_sizes = model.layer_sizes();
  run.config = cfg_.source;
  report_artefact("run.json", [&] { write_file_atomic((dir_ / "run.json").string(), to_json(run).dump(2)); });
}

void RunRecords::write_step(int64_t done, const StepLog& log, double lr, double rate, int64_t skipped,
                            int64_t total_steps, int64_t last) {
  if (!lead_ || !opt_.print) return;
  std::string ppl, used;
  for (const LayerUsage& u : log.usage) {
    ppl += fmt::format("{}{:.0f}", ppl.empty() ? "" : "/", u.perplexity);
    used += fmt::format("{}{}", used.empty() ? "" : "/", u.codes_used);
  }
  std::string gan;
  if (log.discriminator) gan += fmt::format("  disc {:.4f}", *log.discriminator);
  if (log.adversarial) gan += fmt::format("  adv {:.4f}  feat {:.4f}", *log.adversarial, *log.feature);
  progress("step {:>6}/{}  loss {:.5f}  recon {:.5f}{}  ppl {}  used {}  revived {}{}  {:.1f} steps/s  ETA {}\n", done,
           total_steps, log.loss, log.recon, gan, ppl, used, log.revived,
           skipped > 0 ? fmt::format("  skipped {}", skipped) : "", rate,
           duration((last - done) / std::max(rate, 1e-9)));
  TrainLine line{.step = done, .loss = log.loss, .recon = log.recon, .lr = lr, .steps_per_s = rate,
                 .quantizer = log.quantizer, .discriminator = log.discriminator, .adversarial = log.adversarial,
                 .feature = log.feature, .revived = log.revived, .layers = layer_use(log.usage),
                 .skipped_rows = skipped};
  metrics_->write(to_json(line));
}

void RunRecords::write_validation(int64_t done, const Validation& v, CodecModel& model) {
  if (!lead_ || !opt_.print) return;
  progress("validation at step {}: mse {:.6f}  snr {:.2f} dB{}{}{}{}\n", done, v.mse, v.snr_db,
           v.stoi >= 0 ? fmt::format("  STOI {:.3f}", v.stoi) : "",
           v.log_mel >= 0 ? fmt::format("  log-mel L1 {:.3f}", v.log_mel) : "",
           v.stft_distance >= 0 ? fmt::format("  MR-STFT {:.3f}", v.stft_distance) : "",
           v.skipped > 0 ? fmt::format("  skipped {}", v.skipped) : "");
  const ValidationLine line{.step = done,
                            .mse = v.mse,
                            .snr_db = v.snr_db,
                            .log_mel_l1 = measured(v.log_mel),
                            .stft_distance = measured(v.stft_distance),
                            .stoi = measured(v.stoi),
                            .layers = layer_use(v.usage),
                            .skipped_rows = v.skipped};
  metrics_->write(to_json(line));
  report_artefact("code_usage.json", [&] { write_code_usage(done, v); });
  if (data_.sample_rate > 0) report_artefact("clips/", [&] { write_clips(model); }, &model);
}

// What `vqddp report` reads beside the metrics is written by rank 0 alone,
// outside any collective: a failure to write it (a full disk) must not stop
// rank 0 while the others wait at their next collective, and matters less
// than the checkpoint. Warned about, like a metrics line that could not be
// written, and training goes on.
void RunRecords::report_artefact(const char* what, const std::function<void()>& write, CodecModel* model) {
  try {
    write();
  } catch (const std::exception& e) {
    console_line(stderr, "vqddp: warning: {} in {} could not be written ({}); training goes on\n", what, dir_.string(),
                 e.what());
    if (model) model->train();  // write_clips works in eval mode: back to training if it threw there
  }
}

// The code histogram of every layer at this validation, for `vqddp report`
// (one file, replaced each time: only the last one is plotted).
void RunRecords::write_code_usage(int64_t done, const Validation& v) const {
  CodeUsage usage{.step = done, .counts = {}};
  const float* h = v.histogram.data();
  for (const LayerUsage& layer : v.usage) {
    usage.counts.emplace_back(h, h + layer.codebook_size);
    h += layer.codebook_size;
  }
  write_file_atomic((dir_ / "code_usage.json").string(), to_json(usage).dump());
}

// Held-out audio to listen to: kClips stretches of about 2 s, evenly
// spaced through the validation set, and the codec's output for them
// (16-bit WAV in RUN_DIR/clips, replaced at each validation). Rank 0 alone,
// in eval mode: no collective.
void RunRecords::write_clips(CodecModel& model) {
  constexpr int64_t kClips = 4;
  const int64_t rows = data_.validation.rows(), f = data_.example_dim;
  const int64_t frames = std::min<int64_t>(rows / kClips, (2 * data_.sample_rate + f - 1) / f);
  if (frames == 0) return;
  const std::filesystem::path clips = run_subdir(dir_.string(), "clips");
  model.eval();
  for (int64_t k = 0; k < kClips; ++k) {
    Tensor x = data_.validation.read_range(k * (rows / kClips), k * (rows / kClips) + frames,
                                           data_.skip_bad_rows);  // (frames, F)
    Tensor y = model.decode(model.encode(x.to(device_))).to(Device::cpu());
    const std::string stem = (clips / fmt::format("clip_{}_", k)).string();
    write_audio(stem + "original.wav", x.to_vector<float>(), static_cast<int>(data_.sample_rate), AudioEncoding::wav16);
    write_audio(stem + "decoded.wav", y.to_vector<float>(), static_cast<int>(data_.sample_rate), AudioEncoding::wav16);
  }
  model.train();
}

void RunRecords::save(std::span<const TrainedPart> parts, int64_t done, int64_t total_steps, int64_t last) {
  agree_on(comm_, lead_, [&] {
    // The reserve's room is the new checkpoint's until its rename (the
    // last checkpoint stays whole beside it); then it is taken again.
    if (run_dir_) run_dir_->release_reserve();
    save_checkpoint((dir_ / "checkpoint.safetensors").string(), parts, done, total_steps, cfg_.source,
                    data_facts(data_.example_dim, data_.sample_rate));
    if (run_dir_ && done < last) run_dir_->hold_reserve();  // if not, the next check stops the run
  });
}

// How far the world's steps are from the GEMM floor: its FLOPs per step at
// the floor's speed against rank 0's time per step (every rank waits for
// the others at each step's collectives).
TrainResult::Profile RunRecords::profile(int64_t step_flops, int64_t steps_run) {
  int64_t world_flops = 0;
  for (const std::vector<int64_t>& v : gather_values(comm_, {step_flops})) world_flops += v[0];
  if (!lead_) return {};
  const int64_t steps = std::max<int64_t>(steps_run, 1);
  std::vector<OpProfileEntry> entries = op_profile_take();
  double seconds = 0;
  for (const OpProfileEntry& e : entries) seconds += e.seconds;
  const TrainResult::Profile p{.gflop_per_step = static_cast<double>(world_flops) / steps / 1e9,
                               .seconds_per_step = seconds / steps,
                               .gemm_floor = opt_.gemm_floor};
  if (!opt_.print) return p;
  const ProfileFloor floor{opt_.gemm_floor, world_flops > 0 ? static_cast<double>(step_flops) / world_flops : 1.0};
  progress("profile of {} training steps, rank 0 of {} ({}):\n{}", steps_run, comm_.world_size(), device_.str(),
           op_profile_table(entries, steps_run, floor));
  progress("the world's step: {:.3f} GFLOP (rank 0: {:.3f}) in {:.2f} ms, {:.1f} GFLOP/s: {:.1f}% of the GEMM "
           "floor ({:.1f} GFLOP/s)\n", p.gflop_per_step, static_cast<double>(step_flops) / steps / 1e9,
           p.seconds_per_step * 1e3, p.gflop_per_step / p.seconds_per_step, 100 * p.floor_share(), opt_.gemm_floor);
  return p;
}

}  // namespace vqddp
