// The training run's configuration, read from JSON.
//
// Sections: model, quantizer, data, optimizer, gan (optional), schedule,
// distributed, run.
// Quantizer keys follow vector-quantize-pytorch where the concept exists
// there (codebook_size, decay, commitment_weight, threshold_ema_dead_code,
// kmeans_init, kmeans_iters, use_cosine_sim, learnable_codebook,
// num_quantizers, shared_codebook, quantize_dropout,
// quantize_dropout_cutoff_index, quantize_dropout_multiple_of, levels,
// codebook_dim, sync_codebook). Unknown keys and wrong types are errors that
// name the key path (engine/core/config_reader.h).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "data/data_config.h"
#include "engine/core/count_limits.h"
#include "vq/quantizer_options.h"

namespace vqddp {

// The ranges of a run's count keys (engine/core/count_limits.h); the flags that
// override them (tool/cli_args.h) take the same.
namespace limits {
inline constexpr CountRange steps{1, int64_t{1} << 40};     // --steps (0 in a config means "use epochs")
inline constexpr CountRange world{1, 1024};                 // thread ranks; --world, distributed.world_size
inline constexpr CountRange config_steps{0, steps.hi};      // schedule.steps
inline constexpr CountRange epochs{0, int64_t{1} << 30};
inline constexpr CountRange every{0, steps.hi};             // validate_every, checkpoint_every
inline constexpr CountRange log_every{1, steps.hi};
inline constexpr CountRange batch_size{1, int64_t{1} << 24};
inline constexpr CountRange width{1, 65536};                // hidden, latent_dim, tokens, channels
inline constexpr CountRange sample_rate{0, 1'000'000};       // data.sample_rate (0: the first clip's)
inline constexpr CountRange conv_stride{1, 64};            // model.strides
inline constexpr CountRange residual_units{0, 16};         // model.residual_units
inline constexpr CountRange frame{1, int64_t{1} << 24};
inline constexpr CountRange holdout_every{2, kNoLimit};
inline constexpr CountRange readers{1, 64};                  // data.readers (threads per rank)
inline constexpr CountRange prefetch{0, 1024};               // data.prefetch (steps read ahead)
inline constexpr CountRange optional_count{0, kNoLimit};    // max_files, max_examples (0: all)
inline constexpr CountRange hidden_layers{1, 256};        // model.hidden_layers
inline constexpr CountRange period{2, 1024};                 // gan.periods
inline constexpr CountRange stft_window{16, 65536};          // gan.stft_windows
// gan.period_channels, gan.stft_filters: four times the references' widest
// (1024), so a discriminator's weights stay far below what a host holds.
inline constexpr CountRange discriminator_width{1, 4096};
}  // namespace limits

struct ModelConfig {
  // mlp: frame-level MLPs around the quantizer (small examples, tests);
  // conv_codec: a SoundStream-style strided Conv1d encoder, the quantizer on
  // every latent frame, a mirrored ConvTranspose1d decoder (waveforms);
  // conv_vqvae: Conv2d down to a token grid, ConvTranspose2d up (images).
  std::string type = "mlp";
  int64_t hidden = 256;     // mlp
  int hidden_layers = 2;    // mlp: Linear + activation blocks on each side
  int64_t latent_dim = 32;  // D of each token the quantizer sees
  int64_t tokens = 1;       // mlp: tokens per example (the encoder emits tokens * latent_dim)
  std::string activation = "gelu";
  bool sigmoid_output = false;  // decoder output in (0, 1) (images)
  // conv_codec: channels of each stage, one more than strides; conv_vqvae:
  // the two stages' channels (train/networks.h model_config_problem). The
  // config reader fills in the type's default.
  std::vector<int64_t> channels;
  std::vector<int64_t> strides;  // conv_codec: downsampling per stage (their product per token)
  int64_t residual_units = 1;    // conv_codec: dilated residual units per stage (dilation 1, 3, 9, ...)
  bool causal = false;           // conv_codec: every convolution sees only the past (engine/ops.h Conv1dOptions)
  bool weight_norm = true;       // conv types: every convolution weight-normalized
  std::string waveform_loss = "l2";  // conv_codec: l1 or l2 (mse) on the waveform
  double spectral_weight = 0;    // conv_codec: weight of the multi-resolution STFT loss
  double mel_weight = 0;         // conv_codec: weight of the multi-resolution log-mel loss (DAC's mel loss)
  double stoi_weight = 0;        // conv_codec: weight of the band-envelope correlation loss (train/spectral.h StoiLoss)
  bool operator==(const ModelConfig&) const = default;
};

// The "quantizer" section: vq/quantizer_options.h (its keys, its reader).
using QuantizerConfig = QuantizerOptions;

struct OptimizerConfig {
  std::string type = "adamw";  // adamw, sgd
  float lr = 1e-3f;
  float weight_decay = 0.f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float momentum = 0.f;
  float grad_clip = 1.f;  // 0: off
  // constant, or cosine: lr * (f + (1 - f) (1 + cos(pi t / T)) / 2) at step
  // t of T with f = final_lr_fraction, from lr down to f lr at the end.
  std::string lr_schedule = "constant";
  double final_lr_fraction = 0.1;
  bool operator==(const OptimizerConfig&) const = default;
};

// The "gan" section: adversarial training of a conv_codec (train/gan.h).
// Absent: no discriminator, the codec trains on its reconstruction and
// quantizer losses alone.
struct GanConfig {
  bool enabled = false;  // the section is present
  // Multi-period discriminators (HiFi-GAN, DAC), one per period; empty: none.
  std::vector<int64_t> periods{2, 3, 5, 7, 11};
  std::vector<int64_t> period_channels{8, 16, 32};  // each strided stage's channels
  // Multi-scale STFT discriminators (EnCodec), one per window (n_fft, hop a
  // quarter); empty in the file: none. Not given: EnCodec's 2048/1024/512
  // at 24 kHz scaled to the sample rate (powers of two).
  std::vector<int64_t> stft_windows;
  bool stft_windows_given = false;
  int64_t stft_filters = 8;
  std::string loss = "hinge";       // hinge, least_squares
  double adversarial_weight = 1;    // the generator's adversarial loss
  double feature_weight = 2;        // feature matching (L1 relative to the real features)
  int64_t warmup_steps = 0;         // steps with no adversarial loss and no discriminator update
  // Which steps update the discriminators, from the step and run.seed alone:
  // every update_every-th step, each with probability update_probability.
  int64_t update_every = 1;
  double update_probability = 1;
  OptimizerConfig optimizer;        // the discriminators' (lr_schedule and all)
  bool operator==(const GanConfig&) const = default;
};

struct ScheduleConfig {
  int64_t batch_size = 256;  // GLOBAL examples per step, split over the ranks
  int64_t epochs = 1;
  int64_t steps = 0;         // > 0 overrides epochs
  int64_t validate_every = 0;  // steps; 0: only at the end
  int64_t checkpoint_every = 0;
  int64_t log_every = 50;
  bool drop_last = true;  // false: the last batch of an epoch wraps around to stay full
  bool operator==(const ScheduleConfig&) const = default;
};

struct DistributedConfig {
  std::string backend = "thread";
  int world_size = 4;  // thread ranks; nccl takes WORLD_SIZE from its launcher
  double timeout_s = 300;
  // nccl and mpi: compare every collective's fingerprint across ranks
  // before it runs (a debug setting; the thread backend always does).
  bool check_collectives = false;
  bool operator==(const DistributedConfig&) const = default;
};

struct RunConfig {
  std::string dir = "runs/default";
  uint64_t seed = 0;
  // Where the "single" and "thread" ranks train: "cpu", "cuda" (every
  // thread rank on cuda:0) or "sim" (the simulated device: the CPU's
  // arithmetic, every host<->device transfer counted). An nccl rank trains
  // on its own GPU regardless.
  std::string device = "cpu";
  // On a device with stream capture (cuda) a world of one, and on sim a world
  // of one or thread ranks, run each training step after the third as one
  // replay of a captured step graph (engine/step_graph.h), where the step allows it (train/rank_step.cpp
  // says where not, at the start). false: every launch is issued on its own.
  bool step_graphs = true;
  bool step_graphs_given = false;  // set in the file or by --step-graphs, not left to its default
  // What the inputs of the engine's GEMMs and convolutions (matmul, conv;
  // not the quantizers' distance searches) are rounded to before the
  // products (engine/precision.h): "fp32" (none), "tf32" or "bf16", emulated
  // exactly on every device, so W ranks == 1 rank within each.
  std::string precision = "fp32";
  bool operator==(const RunConfig&) const = default;
};

struct Config {
  ModelConfig model;
  QuantizerConfig quantizer;
  DataConfig data;
  OptimizerConfig optimizer;
  GanConfig gan;
  ScheduleConfig schedule;
  DistributedConfig distributed;
  RunConfig run;
  // The JSON it was read from, without command-line overrides (stored in
  // checkpoints: the same run started with another --dir or --steps writes
  // the same bytes).
  nlohmann::json source;
  bool operator==(const Config&) const = default;
};

// `file` names the source in error messages.
Config parse_config(const nlohmann::json& j, const std::string& file);

// One command-line override of a config key: `flag` (as typed, "--steps")
// sets the dotted `key` ("schedule.steps") to `value`.
struct ConfigOverride {
  std::string flag;
  std::string key;
  nlohmann::json value;
};
// The overrides written into the JSON (the section is created where the
// file has none), then parse_config: an override is parsed and checked as if
// the file held it, before anything is loaded, and errors name the flags.
Config parse_config(nlohmann::json j, const std::string& file, const std::vector<ConfigOverride>& overrides);
// JSON text (comments allowed) -> Config; `origin` names it in errors.
Config parse_config_text(const std::string& text, const std::string& origin);
Config load_config(const std::string& path);
// The file's JSON (comments allowed), not yet read as a config.
nlohmann::json load_config_json(const std::string& path);
// The values run.device (and `vqddp train --device`) accepts.
const std::vector<std::string>& run_device_names();

}  // namespace vqddp
