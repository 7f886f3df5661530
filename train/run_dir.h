// The run directory, checked when a run starts rather than at its first
// checkpoint, after hours of training: it must exist or be creatable, be
// writable, and have room for one more checkpoint (the new file is written
// next to the old one before it replaces it).
//
// It belongs to one run at a time. A fresh run (no --resume) into a
// directory that already holds a run (a checkpoint or a metrics log) is
// refused, naming the ways on: resume it, choose another directory, or
// --overwrite (which removes the old run's files first). The run holds an
// exclusive lock on <dir>/.lock (flock) for its whole life, so a second run
// started into the same directory is refused, never interleaved; the lock
// goes with the process, even a killed one.
// Internal header: not installed with the library (the trainer's run directory).
#pragma once

#include <cstdint>
#include <string>

namespace vqddp {

enum class RunStart { fresh, resume, overwrite };

class RunDir {
 public:
  // Creates `dir` if needed, takes its lock, and checks it for `start`;
  // errors name the directory and say what is wrong.
  RunDir(const std::string& dir, int64_t checkpoint_bytes, RunStart start);
  ~RunDir();
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;

 private:
  int lock_fd_ = -1;
};

// The files of a run in its directory, in the order a message names them.
inline constexpr const char* kRunFiles[] = {"checkpoint.safetensors", "metrics.jsonl"};

}  // namespace vqddp
