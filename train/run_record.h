// The run record: what a run writes beside its checkpoint for people and
// for `vqddp report`, as types with one writer (to_json) and one reader
// (from_json) each, so the trainer and the report share every key:
//   run.json         RunFacts, written when the run starts
//   metrics.jsonl    one TrainLine per log line, one ValidationLine per
//                    validation (train/metrics_log.h appends them)
//   code_usage.json  CodeUsage, the last validation's code histograms
// Readers are lenient where a run of an older build, or one cut off by a
// kill, left a value out: a number that is absent (or null, which is how a
// NaN is written) reads as nullopt and is simply not shown.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace vqddp {

// One codebook layer's use over a step's or a validation's rows.
struct LayerUse {
  std::optional<double> perplexity;  // exp(entropy) of the code histogram
  std::optional<int64_t> codes_used;  // codes chosen at least once
};

struct RunFacts {
  std::string description, backend, device;
  std::optional<int64_t> world_size, total_steps, sample_rate, example_dim;
  std::optional<double> bits_per_example, bitrate;
  std::vector<int64_t> layer_sizes;  // codes per index column
  nlohmann::json config;             // the config's source (null when absent)
};

struct TrainLine {
  int64_t step = 0;
  std::optional<double> loss, recon, lr, steps_per_s;
  std::optional<double> quantizer;  // the quantizer's loss (lines before it was logged: loss - recon)
  // A GAN run's (train/gan.h), past its warm-up: the discriminators' loss of
  // this step's update (only on steps that update them, so a resumed run
  // logs what the uninterrupted one did), the codec's adversarial and
  // feature-matching losses.
  std::optional<double> discriminator, adversarial, feature;
  std::optional<int64_t> revived;
  std::vector<LayerUse> layers;
  int64_t skipped_rows = 0;  // rows replaced so far (data.bad_files "skip"); written when > 0
};

struct ValidationLine {
  int64_t step = 0;
  std::optional<double> mse, snr_db, log_mel_l1, stft_distance, stoi;  // log_mel_l1, stft_distance, stoi: audio runs only
  std::vector<LayerUse> layers;
  int64_t skipped_rows = 0;
};

struct CodeUsage {
  int64_t step = 0;
  std::vector<std::vector<int64_t>> counts;  // per layer, one count per code
};

nlohmann::json to_json(const RunFacts& r);
nlohmann::json to_json(const TrainLine& l);
nlohmann::json to_json(const ValidationLine& l);
nlohmann::json to_json(const CodeUsage& u);

// `j` as the record; `where` names the file in errors (a malformed shape,
// not a missing number, is an error).
RunFacts run_facts_from_json(const nlohmann::json& j, const std::string& where);
CodeUsage code_usage_from_json(const nlohmann::json& j, const std::string& where);

// A metrics.jsonl line is a validation line when it holds a "validation_"
// key, else a training line; one without a number "step" (cut off by a
// kill) is neither.
bool is_validation_line(const nlohmann::json& j);
std::optional<TrainLine> train_line_from_json(const nlohmann::json& j);
std::optional<ValidationLine> validation_line_from_json(const nlohmann::json& j);

}  // namespace vqddp
