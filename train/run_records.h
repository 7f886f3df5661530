// What a run leaves in its directory and on the console: the directory
// itself (checked and claimed before any step), progress lines, the
// metrics file, what `vqddp report` reads beside them (run.json,
// code_usage.json, clips/), checkpoints, and the --profile table. Rank 0
// writes; where a failure must stop every rank (the directory refused, a
// checkpoint that cannot be written), every rank learns how it went
// (comm/agree.h) and those calls are collectives.
//
// Internal header: not installed with the library (the trainer's records).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "data/dataset.h"
#include "train/config.h"
#include "train/metrics_log.h"
#include "train/run_dir.h"
#include "train/schedule.h"
#include "train/step_health.h"
#include "train/trainer.h"
#include "train/validation.h"

namespace vqddp {

class RunRecords {
 public:
  RunRecords(const Config& cfg, const Dataset& data, const TrainOptions& opt, Communicator& comm, Device device);

  // Collective, before any step is trained: the run directory is checked
  // (room for a checkpoint of `parts`) and the metrics file opened (cut back
  // to the resumed `step`); temporaries of a save killed midway go before
  // this run writes its first checkpoint. A refused directory stops every
  // rank at once, not at their timeout.
  void open(std::span<const TrainedPart> parts, int64_t step);
  // Rank 0's first lines, and run.json.
  void print_start(const CodecModel& model, const Schedule& schedule, int64_t step);
  // A logged step's progress line and metrics line (rank 0; `rate` in steps
  // per second, `skipped` the rows skipped so far over all ranks).
  void write_step(int64_t done, const StepLog& log, double lr, double rate, int64_t skipped, int64_t total_steps,
                  int64_t last);
  // A validation's progress and metrics lines, its code histogram
  // (code_usage.json) and, for audio, clips to listen to (rank 0).
  void write_validation(int64_t done, const Validation& v, CodecModel& model);
  // Collective: rank 0 saves the checkpoint of step `done`; every rank
  // learns whether it could (a full disk stops all of them here, not the
  // others at their next collective's timeout).
  void save(std::span<const TrainedPart> parts, int64_t done, int64_t total_steps, int64_t last);
  // Collective under --profile: the world's FLOPs per step (a gather) and
  // rank 0's table, op by op, against the GEMM floor.
  TrainResult::Profile profile(int64_t step_flops, int64_t steps);

  const RunDir* run_dir() const { return run_dir_ ? &*run_dir_ : nullptr; }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  void report_artefact(const char* what, const std::function<void()>& write, CodecModel* model = nullptr);
  void write_code_usage(int64_t done, const Validation& v) const;
  void write_clips(CodecModel& model);

  const Config& cfg_;
  const Dataset& data_;
  const TrainOptions& opt_;
  Communicator& comm_;
  const Device device_;
  const bool lead_;
  const std::filesystem::path dir_;
  std::optional<RunDir> run_dir_;
  std::optional<MetricsLog> metrics_;
};

}  // namespace vqddp
