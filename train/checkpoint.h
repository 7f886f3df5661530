// Checkpoints: one safetensors file holding everything a run needs to go
// on bit for bit: parameters ("param.*"), buffers such as codebooks and
// their counters ("buffer.*"), optimizer state ("optim.*"), the step
// ("train.step"), and the config JSON in the metadata. The data order needs
// no state of its own: it is a function of (seed, epoch) (train/schedule.h).
// Written atomically (temp file + rename) by rank 0; read by every rank.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "engine/optim.h"

namespace vqddp {

void save_checkpoint(const std::string& path, const Module& model, Optimizer& optim, int64_t step,
                     const nlohmann::json& config);

// Loads into the live tensors of `model` and `optim` and returns the step.
// Any tensor that is missing, extra, or of another shape or dtype than the
// model's is an error naming the first one, before anything is changed.
// With `config`, the settings a bit-exact continuation depends on (model,
// quantizer, data, optimizer, batch size, drop_last, seed) must match the
// checkpoint's; the first differing key is named.
int64_t load_checkpoint(const std::string& path, Module& model, Optimizer& optim,
                        const nlohmann::json* config = nullptr);

// The tensors a checkpoint of `model` + `optim` holds, by name.
NamedTensors checkpoint_tensors(const Module& model, Optimizer& optim);

}  // namespace vqddp
