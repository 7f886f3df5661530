// The run directory, checked when a run starts rather than at its first
// checkpoint, after hours of training: it must exist or be creatable, be
// writable, and have room for one more checkpoint (the new file is written
// next to the old one before it replaces it).
#pragma once

#include <cstdint>
#include <string>

namespace vqddp {

// Creates `dir` if needed; errors name the directory and say what is wrong.
void prepare_run_dir(const std::string& dir, int64_t checkpoint_bytes);

}  // namespace vqddp
