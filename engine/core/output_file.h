// The one way vqddp writes a file: checkpoints, metrics, run records, codes
// files, audio, reports, converted audio and the file store all go through
// OutputFile (or write_file_atomic, which is OutputFile in one call).
//
// - The bytes go to a temporary in the destination's own directory, named
//   "<name>.tmp.<pid>.<16 random hex digits>" and created with O_CREAT |
//   O_EXCL | O_NOFOLLOW: a file or a symbolic link planted under that name
//   makes the create fail instead of being followed or overwritten, and the
//   name cannot be guessed ahead of time anyway.
// - commit() fsyncs the temporary, renames it over the destination (a
//   rename replaces a symbolic link there, never what it points to) and
//   fsyncs the directory: a crash leaves the old file or the whole new one.
// - Any other end removes the temporary: an error (the destructor), and
//   SIGINT/SIGTERM while remove_temporaries_on_signal() is installed (the
//   executable installs it for every command; the trainer's own handler
//   calls remove_live_temporaries() before it stops at once).
// - A temporary left by a process that died anyway (kill -9, power loss) is
//   recognised by the pid in its name and removed by the next OutputFile
//   made for the same destination (remove_stale_temporaries).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace vqddp {

class OutputFile {
 public:
  // Creates the temporary for `path` (whose directory must exist), after
  // removing stale ones of dead writers unless `remove_stale` is false
  // (where other hosts write the same path: see remove_stale_temporaries).
  // Errors name `path`.
  explicit OutputFile(std::string path, bool remove_stale = true);
  ~OutputFile();  // not committed: the temporary is removed
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  // The temporary's descriptor, for writers that take one (libsndfile's
  // sf_open_fd); they must not close it.
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  const std::string& temporary() const { return temp_; }

  void write(const void* data, size_t n);
  // fsync, close, rename over path(), fsync the directory.
  void commit();

 private:
  void discard() noexcept;

  std::string path_, temp_;
  int fd_ = -1;
  int slot_ = -1;  // this temporary's place in the signal handler's list, or -1
};

// The directory a command writes its outputs into (`--out DIR`), made only
// when the first output is ready to be written, so a command that fails
// before (a bad input) leaves no directory behind; one that fails after
// removes the directories it made if they are still empty.
class OutputDir {
 public:
  // `command` ("encode") names the command in errors. Refuses an empty
  // name and a path that exists but is not a directory.
  OutputDir(std::string dir, std::string command);
  ~OutputDir();  // not kept: the directories made, where still empty, are removed
  OutputDir(const OutputDir&) = delete;
  OutputDir& operator=(const OutputDir&) = delete;

  // DIR/NAME, refused (naming it and `command` --overwrite) where something
  // is there already, a symbolic link included, and `overwrite` is false;
  // refused where that something is a directory. Makes nothing.
  std::string path_for(const std::string& name, bool overwrite) const;
  // Makes DIR and its missing parents (once).
  void create();
  // The command succeeded: what was made stays.
  void keep() { kept_ = true; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_, command_;
  std::vector<std::string> made_;  // deepest last
  bool kept_ = false;
};

// `bytes` as the whole new contents of `path` (OutputFile, write, commit).
void write_file_atomic(const std::string& path, const std::string& bytes, bool remove_stale = true);

// Removes the temporaries OutputFile left next to `path` when its process
// died mid-write: those whose pid names no running process, and those of
// this process's own pid that no live OutputFile of this process holds
// (an earlier process's that had the same pid: a restarted container hands
// out the same pids). A pid of another host (a directory shared over NFS)
// may look dead here: use it where one host writes `path`. Returns the
// paths removed.
std::vector<std::string> remove_stale_temporaries(const std::string& path);

// Installs SIGINT and SIGTERM handlers that remove every live temporary and
// then end the process with the signal's default action (exit status
// 128 + signal). For commands that have no graceful stop of their own.
void remove_temporaries_on_signal();

// Unlinks every live temporary of this process, waiting (up to 2 s in all)
// for other threads' temporaries whose open() is in progress. After it, an
// OutputFile made on any thread creates no file: it waits for the end of
// the process. Async-signal-safe: for signal handlers that are about to
// end the process.
void remove_live_temporaries() noexcept;

}  // namespace vqddp
