// Checkpoints: one safetensors file holding everything a run needs to go
// on bit for bit: parameters ("param.*"), buffers such as codebooks and
// their counters ("buffer.*"), optimizer state ("optim.*"), a GAN's
// discriminators and their optimizer ("discriminator.*"), the step
// ("train.step"), and the config JSON in the metadata. The data order needs
// no state of its own: it is a function of (seed, epoch) (train/schedule.h).
// Written atomically (temp file + rename) by rank 0; read by every rank.
//
// A checkpoint defends itself: format vqddp-checkpoint/2 carries a CRC32C
// of every tensor (engine/core/safetensors.h) and a load refuses one without
// them; format 1, written before checksums existed, still loads, unverified,
// so runs checkpointed then can resume. Every value is range-checked before
// anything changes: the step against the schedule, parameters and float
// state finite, each buffer against the range its module registered with it
// (engine/nn.h ValueRange), so a counter's rule lives next to the code that
// relies on it.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "engine/optim.h"
#include "engine/core/safetensors.h"

namespace vqddp {

// A GAN run's discriminators and their optimizer (train/gan.h): a
// checkpoint keeps them beside the codec, their tensors named
// "discriminator." + the codec's scheme ("discriminator.param.*",
// "discriminator.optim.*"). Inference (load_model_weights) passes over them.
struct DiscriminatorState {
  const Module& model;
  Optimizer& optim;
};

// `total_steps` (the schedule's length) is kept in the metadata beside the
// config: under a cosine schedule a resume must have the same. `data`, when
// given, is what the data set turned out to be and the config may leave
// open (data_facts below), kept as the metadata 'data'.
void save_checkpoint(const std::string& path, const Module& model, Optimizer& optim, int64_t step,
                     int64_t total_steps, const nlohmann::json& config, const nlohmann::json& data = nullptr,
                     const DiscriminatorState* discriminator = nullptr);

// The data facts a checkpoint keeps for inference: {"example_dim": F,
// "sample_rate": Hz (0 for images)}. data.sample_rate 0 in a config means
// "the first clip's rate", so only the run knows it.
nlohmann::json data_facts(int64_t example_dim, int64_t sample_rate);
// The checkpoint's data facts; null for a checkpoint written without them.
nlohmann::json checkpoint_data_facts(const SafetensorsFile& checkpoint);

// Loads a checkpoint's parameters and buffers into `model` for inference
// (its optimizer state and step are not read), with the checks of
// load_checkpoint on every tensor the model has; returns the step.
int64_t load_model_weights(const SafetensorsFile& checkpoint, Module& model);

// Loads into the live tensors of `model` and `optim` and returns the step.
// Checks everything before anything is changed, so a refused file leaves
// model and optimizer as they were; each error names the file and the
// tensor or metadata key:
//   - the file's structure and checksums (read_checkpoint);
//   - 'train.step' int64[1] in [0, total_steps] (the schedule's);
//   - any tensor missing, extra, or of another shape or dtype than the
//     model's (the first one is named);
//   - values: see the top of this file.
// With `config`, the settings a bit-exact continuation depends on (model,
// quantizer, data, optimizer, batch size, drop_last, seed) must match the
// checkpoint's; the first differing key is named. Under lr_schedule cosine
// `total_steps` must also be the checkpoint's run's length (when it was
// stored: checkpoints before it resume unchecked).
// With `discriminator`, its tensors are loaded and checked alike (a GAN
// run's checkpoint must hold them; a checkpoint without one cannot resume
// a GAN run, the config differing at 'gan' anyway).
int64_t load_checkpoint(const std::string& path, Module& model, Optimizer& optim, int64_t total_steps,
                        const nlohmann::json* config = nullptr, const DiscriminatorState* discriminator = nullptr);

// The parts of a config that a bit-exact continuation depends on: model,
// quantizer, data, optimizer, schedule.batch_size and drop_last, run.seed.
nlohmann::json continuation_keys(const nlohmann::json& config);

// The checkpoint file at `path`, structure and checksums verified, its
// format one this vqddp reads. What load_checkpoint and `vqddp inspect` read.
SafetensorsFile read_checkpoint(const std::string& path);
// Its 'train.step': int64[1], not negative.
int64_t checkpoint_step(const SafetensorsFile& checkpoint);
// Its config: the metadata 'config', which must be JSON.
nlohmann::json checkpoint_config(const SafetensorsFile& checkpoint);

// The tensors a checkpoint of `model` + `optim` (+ `discriminator`) holds, by name.
NamedTensors checkpoint_tensors(const Module& model, Optimizer& optim,
                                const DiscriminatorState* discriminator = nullptr);

}  // namespace vqddp
