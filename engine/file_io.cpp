#include "engine/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>

#include "engine/error.h"

namespace vqddp {

namespace {
struct FileClose {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
}  // namespace

std::string read_file(const std::string& path) {
  std::unique_ptr<std::FILE, FileClose> f(std::fopen(path.c_str(), "rb"));
  VQDDP_CHECK(f, "{}: cannot open for reading: {}", path, std::strerror(errno));
  std::string bytes;
  char buf[1 << 16];
  size_t r;
  while ((r = std::fread(buf, 1, sizeof buf, f.get())) > 0) bytes.append(buf, r);
  VQDDP_CHECK(!std::ferror(f.get()), "{}: read error: {}", path, std::strerror(errno));
  return bytes;
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  std::random_device rd;
  std::string tmp = fmt::format("{}.tmp.{}.{:08x}", path, getpid(), rd());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  VQDDP_CHECK(fd >= 0, "{}: cannot create temporary file {}: {}", path, tmp, std::strerror(errno));
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t w = ::write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int err = w == 0 ? EIO : errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      VQDDP_THROW("{}: write failed: {}", path, std::strerror(err));
    }
    p += w;
    left -= static_cast<size_t>(w);
  }
  int err = 0;
  while (::fsync(fd) != 0) {
    if (errno == EINTR) continue;
    err = errno;
    break;
  }
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    VQDDP_THROW("{}: cannot write {} and rename it into place: {}", path, tmp, std::strerror(err));
  }
  // Make the rename itself durable: fsync the directory that holds the file.
  std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/') + 1);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace vqddp
