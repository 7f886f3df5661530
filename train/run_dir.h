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

// unsaved: a start of `train --resume auto` that found no checkpoint. A
// metrics log there is of steps never saved and is replaced; a checkpoint
// found now (this process did not see it when it chose, as a stale network
// file system may) is refused, never removed.
enum class RunStart { fresh, resume, overwrite, unsaved };

class RunDir {
 public:
  // Creates `dir` if needed, takes its lock, and checks it for `start`;
  // errors name the directory and say what is wrong. With `reserve`, the
  // room of one checkpoint is taken at once as <dir>/.reserve (below).
  RunDir(const std::string& dir, int64_t checkpoint_bytes, RunStart start, bool reserve = false);
  ~RunDir();
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;

  // A disk that other writers fill during a run must still take its next
  // checkpoint: the room for one (`checkpoint_bytes`, what a save needs
  // beside the last checkpoint until its rename) is held as <dir>/.reserve
  // between saves. release_reserve() gives it back just before a save;
  // hold_reserve() takes it again after, and false says the disk no longer
  // had it.
  void release_reserve();
  bool hold_reserve();
  // The disk is nearly full: the reserve could not be taken again, or less
  // than kDiskMargin is free beside it. The trainer then saves a checkpoint
  // into the reserve's room and stops, rather than train on for hours it
  // could not save.
  bool disk_low() const;
  int64_t free_bytes() const;  // on the run directory's file system (-1: unknown)

  static constexpr int64_t kDiskMargin = int64_t{1} << 20;

 private:
  std::string dir_, reserve_path_;
  int64_t reserve_bytes_ = 0;  // 0: no reserve
  bool reserve_held_ = false;
  int lock_fd_ = -1;
};

// "12.3 MiB".
std::string mib(int64_t bytes);

// `dir`/`name` as a directory of the run's own, created if missing: one
// that is a symbolic link (or not a directory) is refused, naming it, so a
// run never writes through a link planted in its directory.
std::string run_subdir(const std::string& dir, const char* name);

// The files of a run in its directory, in the order a message names them.
inline constexpr const char* kRunFiles[] = {"checkpoint.safetensors", "metrics.jsonl"};

}  // namespace vqddp
