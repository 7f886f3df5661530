// The files a data source names, checked before anything reads them: one
// stat or one non-blocking open, refused in words a user reads ("does not
// exist", "is a symbolic link loop", and engine/core/file_io.h's "is a FIFO
// (named pipe), not a regular file" for what is not a regular file), so
// neither a FIFO nor /dev/zero can block or feed a reader, and errno's or
// std::filesystem's texts ("Operation not supported" for a FIFO's size)
// never stand for ours. Messages show long paths shortened
// (engine/core/shown.h).
// Internal header: not installed with the library.
#pragma once

#include <cstdint>
#include <string>

#include "engine/core/error.h"

namespace vqddp {

// What one stat of a regular file says: what the index and each read
// compare (size, modification time), and its identity (the same file under
// two names is one clip twice).
struct FileStamp {
  int64_t bytes = 0, mtime_ns = 0;
  uint64_t device = 0, inode = 0;
  bool same_file(const FileStamp& o) const { return device == o.device && inode == o.inode; }
};

// Why `path` cannot be reached (stat fails), in words: "does not exist",
// "is a symbolic link to a missing file", "is a symbolic link loop"...; ""
// when it can.
std::string path_problem(const std::string& path);

// Why `path` is no data file (path_problem, or what it is instead of a
// regular file); "" when it is one, and then `stamp` (if given) is set.
std::string file_problem(const std::string& path, FileStamp* stamp = nullptr);

// `path`'s stamp (following links), or an Error "PATH: file_problem".
FileStamp file_stamp(const std::string& path);

// `path` open for reading, refused like file_stamp (checked on the open
// descriptor, so a file swapped for a FIFO in between cannot block).
class DataFile {
 public:
  explicit DataFile(const std::string& path);
  ~DataFile();
  DataFile(const DataFile&) = delete;
  DataFile& operator=(const DataFile&) = delete;
  int fd() const { return fd_; }
  int release();  // the descriptor, now the caller's to close
  const FileStamp& stamp() const { return stamp_; }

 private:
  int fd_ = -1;
  FileStamp stamp_;
};

// CRC32C of the open file's first and last 4 KiB (all of it when smaller):
// a clip's content stand-in (data/audio_windows.h AudioClip::ends), which
// also covers the bytes its header is read from.
uint32_t ends_crc(const DataFile& file, const std::string& path);

// `e` with each `path` in its message shortened: the readers name a file
// in full, and a path from a list may be very long.
Error with_path_shown(const Error& e, const std::string& path);

}  // namespace vqddp
