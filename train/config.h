// The training run's configuration, read from JSON.
//
// Sections: model, quantizer, data, optimizer, schedule, distributed, run.
// Quantizer keys follow vector-quantize-pytorch where the concept exists
// there (codebook_size, decay, commitment_weight, threshold_ema_dead_code,
// kmeans_init, kmeans_iters, use_cosine_sim, learnable_codebook,
// num_quantizers, shared_codebook, quantize_dropout,
// quantize_dropout_cutoff_index, quantize_dropout_multiple_of, levels,
// codebook_dim, sync_codebook). Unknown keys and wrong types are errors that
// name the key path (engine/config_reader.h).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "vq/codebook.h"

namespace vqddp {

struct ModelConfig {
  int64_t hidden = 256;
  int hidden_layers = 2;    // Linear + activation blocks on each side
  int64_t latent_dim = 32;  // D of each token the quantizer sees
  int64_t tokens = 1;       // tokens per example: the encoder emits tokens * latent_dim
  std::string activation = "gelu";
  bool sigmoid_output = false;  // decoder output in (0, 1) (images)
};

struct QuantizerConfig {
  std::string type = "residual_vq";  // vq, residual_vq, fsq, residual_fsq
  int64_t codebook_size = 256;
  int num_quantizers = 4;
  int64_t codebook_dim = 0;
  bool shared_codebook = false;
  float commitment_weight = 1.f;
  CodebookOptions codebook;  // decay, eps, threshold, kmeans, cosine, learnable, cluster_size_init, sync
  bool quantize_dropout = false;
  int quantize_dropout_cutoff_index = 0;
  int quantize_dropout_multiple_of = 1;
  std::vector<int> levels;  // FSQ
};

struct DataSourceConfig {
  std::string path;  // a directory of WAV files, or an IDX file
  double weight = 1;
};

struct DataConfig {
  std::string type = "wav_frames";  // wav_frames, fashion_mnist
  std::vector<DataSourceConfig> sources;
  int64_t frame = 80;            // wav_frames: samples per example
  int64_t max_files = 0;         // wav_frames: per source, 0 = all
  int64_t holdout_every = 10;    // wav_frames: every k-th clip is held out for validation
  std::string validation_path;   // fashion_mnist: IDX images for validation
  int64_t max_examples = 0;      // per source, 0 = all
};

struct OptimizerConfig {
  std::string type = "adamw";  // adamw, sgd
  float lr = 1e-3f;
  float weight_decay = 0.f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float momentum = 0.f;
  float grad_clip = 1.f;  // 0: off
};

struct ScheduleConfig {
  int64_t batch_size = 256;  // GLOBAL examples per step, split over the ranks
  int64_t epochs = 1;
  int64_t steps = 0;         // > 0 overrides epochs
  int64_t validate_every = 0;  // steps; 0: only at the end
  int64_t checkpoint_every = 0;
  int64_t log_every = 50;
  bool drop_last = true;  // false: the last batch of an epoch wraps around to stay full
};

struct DistributedConfig {
  std::string backend = "thread";
  int world_size = 4;  // thread ranks; nccl takes WORLD_SIZE from its launcher
  double timeout_s = 300;
  // nccl: compare every collective's fingerprint across ranks before it runs
  // (a debug setting; the thread backend always does).
  bool check_collectives = false;
};

struct RunConfig {
  std::string dir = "runs/default";
  uint64_t seed = 0;
  // Where the "single" and "thread" ranks train: "cpu", "cuda" (every
  // thread rank on cuda:0) or "sim" (the simulated device: the CPU's
  // arithmetic, every host<->device transfer counted). An nccl rank trains
  // on its own GPU regardless.
  std::string device = "cpu";
};

struct Config {
  ModelConfig model;
  QuantizerConfig quantizer;
  DataConfig data;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  DistributedConfig distributed;
  RunConfig run;
  nlohmann::json source;  // the JSON it was read from (stored in checkpoints)
};

// `file` names the source in error messages.
Config parse_config(const nlohmann::json& j, const std::string& file);
// JSON text (comments allowed) -> Config; `origin` names it in errors.
Config parse_config_text(const std::string& text, const std::string& origin);
Config load_config(const std::string& path);
// The values run.device (and `vqddp train --device`) accepts.
const std::vector<std::string>& run_device_names();

}  // namespace vqddp
