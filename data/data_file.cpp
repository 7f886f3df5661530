#include "data/data_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "engine/core/file_io.h"
#include "engine/core/shown.h"

namespace vqddp {

namespace {

// Why stat or open failed with `err`, in words: errno's own text says "No
// such file or directory" for a link to a missing file and "Too many levels
// of symbolic links" for a loop.
std::string errno_problem(const std::string& path, int err) {
  struct stat link {};
  const bool is_link = ::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode);
  switch (err) {
    case ENOENT: return is_link ? "is a symbolic link to a missing file" : "does not exist";
    case ELOOP: return is_link ? "is a symbolic link loop" : "lies under a symbolic link loop";
    case ENAMETOOLONG: return fmt::format("is a path of {} bytes, longer than the system opens", path.size());
    case ENOTDIR: return "does not exist (a directory in its path is a file)";
    default: return fmt::format("cannot be read: {}", std::strerror(err));
  }
}

// What `path`, not a regular file, is: file_io's words, without its prefix.
std::string kind_problem(const std::string& path) {
  try {
    require_regular_file(path);
  } catch (const Error& e) {
    const std::string message = e.what(), prefix = path + ": ";
    return message.starts_with(prefix) ? message.substr(prefix.size()) : message;
  }
  return "is not a regular file (it changed while it was checked)";
}

FileStamp stamp_of(const struct stat& st) {
  return {static_cast<int64_t>(st.st_size), int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec,
          static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

}  // namespace

std::string path_problem(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? "" : errno_problem(path, errno);
}

std::string file_problem(const std::string& path, FileStamp* stamp) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return errno_problem(path, errno);
  if (!S_ISREG(st.st_mode)) return kind_problem(path);
  if (stamp) *stamp = stamp_of(st);
  return "";
}

FileStamp file_stamp(const std::string& path) {
  FileStamp stamp;
  const std::string problem = file_problem(path, &stamp);
  VQDDP_CHECK(problem.empty(), "{}: {}", shown(path), problem);
  return stamp;
}

DataFile::DataFile(const std::string& path) {
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer. It changes
  // nothing for a regular file's reads.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  VQDDP_CHECK(fd_ >= 0, "{}: cannot open for reading: {}", shown(path), errno_problem(path, errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    VQDDP_THROW("{}: {}", shown(path), kind_problem(path));
  }
  stamp_ = stamp_of(st);
}

DataFile::~DataFile() {
  if (fd_ >= 0) ::close(fd_);
}

int DataFile::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

uint32_t ends_crc(const DataFile& file, const std::string& path) {
  constexpr int64_t kEnd = 4096;
  const int64_t bytes = file.stamp().bytes;
  std::vector<char> buf(static_cast<size_t>(std::min(bytes, 2 * kEnd)));
  const int64_t head = std::min(bytes, kEnd), tail = static_cast<int64_t>(buf.size()) - head;
  const bool ok = ::pread(file.fd(), buf.data(), head, 0) == head &&
                  (tail == 0 || ::pread(file.fd(), buf.data() + head, tail, bytes - tail) == tail);
  VQDDP_CHECK(ok, "{}: cannot read its first and last 4 KiB (it shrank while it was read)", shown(path));
  return crc32c(buf.data(), buf.size());
}

Error with_path_shown(const Error& e, const std::string& path) {
  std::string message = e.what();
  const std::string short_path = shown(path);
  if (short_path.size() < path.size())
    for (size_t at = message.find(path); at != std::string::npos; at = message.find(path, at + short_path.size()))
      message.replace(at, path.size(), short_path);
  return Error(message, e.where());
}

}  // namespace vqddp
