// Checkpoints: one safetensors file holding everything a run needs to go
// on bit for bit: every trained part's (train/trained_part.h) parameters
// (prefix + "param.*"), buffers such as codebooks and their counters
// ("buffer.*") and optimizer state ("optim.*"), part after part: the
// codec's under no prefix, a GAN's discriminators' under "discriminator.";
// then the step ("train.step"), and the config JSON in the metadata. The data order needs
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

#include "engine/core/safetensors.h"
#include "train/trained_part.h"

namespace vqddp {

// `total_steps` (the schedule's length) is kept in the metadata beside the
// config: under a cosine schedule a resume must have the same. `data`, when
// given, is what the data set turned out to be and the config may leave
// open (data_facts below), kept as the metadata 'data'.
void save_checkpoint(const std::string& path, std::span<const TrainedPart> parts, int64_t step, int64_t total_steps,
                     const nlohmann::json& config, const nlohmann::json& data = nullptr);

// The data facts a checkpoint keeps for inference: {"example_dim": F,
// "sample_rate": Hz (0 for images)}. data.sample_rate 0 in a config means
// "the first clip's rate", so only the run knows it.
nlohmann::json data_facts(int64_t example_dim, int64_t sample_rate);
// The checkpoint's data facts; null for a checkpoint written without them.
nlohmann::json checkpoint_data_facts(const SafetensorsFile& checkpoint);

// Loads a checkpoint's codec parameters and buffers (no prefix) into
// `model` for inference (the optimizer state, the step and any other
// part's tensors are passed over), with the checks of load_checkpoint on
// every tensor the model has; returns the step.
int64_t load_model_weights(const SafetensorsFile& checkpoint, Module& model);

// Loads into the live tensors of every part and returns the step. Checks
// everything before anything is changed, so a refused file leaves every
// module and optimizer as it was; each error names the file and the
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
// Every part's tensors are loaded and checked alike (a GAN run's
// checkpoint must hold the discriminators'; one without them cannot resume
// a GAN run, the config differing at 'gan' anyway).
int64_t load_checkpoint(const std::string& path, std::span<const TrainedPart> parts, int64_t total_steps,
                        const nlohmann::json* config = nullptr);

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

// The tensors a checkpoint of `parts` holds, by name, in the file's order
// (without 'train.step').
NamedTensors checkpoint_tensors(std::span<const TrainedPart> parts);

}  // namespace vqddp
