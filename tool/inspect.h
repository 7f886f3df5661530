// `vqddp inspect CHECKPOINT`: what a checkpoint holds, for a person: the
// step, the config, and per codebook its usage (codes whose EMA count is at
// least 1), dead codes (below threshold_ema_dead_code) and the perplexity of
// its EMA code counts; then every tensor: name, dtype, shape and CRC-32C.
#pragma once

#include <string>

namespace vqddp {

// The report as text (the CLI prints it).
std::string inspect_checkpoint(const std::string& path);

// `vqddp inspect CODES`: a codes file (train/codes_file.h): its format,
// audio (rate, samples, duration), frames, tokens and layers with their
// codebook sizes and bits, the packed and entropy bitrates, the codec's
// fingerprint and step, and the source's name.
std::string inspect_codes(const std::string& path);

// Either, by what the file says it is (its "format" metadata).
std::string inspect_file(const std::string& path);

}  // namespace vqddp
