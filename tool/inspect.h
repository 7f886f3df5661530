// `vqddp inspect CHECKPOINT`: what a checkpoint holds, for a person: the
// step, the config, and per codebook its usage (codes whose EMA count is at
// least 1), dead codes (below threshold_ema_dead_code) and the perplexity of
// its EMA code counts; then every tensor: name, dtype, shape and CRC-32C.
#pragma once

#include <string>

namespace vqddp {

// The report as text (the CLI prints it).
std::string inspect_checkpoint(const std::string& path);

}  // namespace vqddp
