#include "train/run_dir.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "engine/error.h"

namespace vqddp {

namespace {

std::string mib(int64_t bytes) { return fmt::format("{:.1f} MiB", bytes / 1048576.0); }

}  // namespace

void prepare_run_dir(const std::string& dir, int64_t checkpoint_bytes) {
  VQDDP_CHECK(!dir.empty(), "the run directory is \"\" (set run.dir or --dir)");
  std::error_code ec;
  VQDDP_CHECK(!std::filesystem::exists(dir, ec) || std::filesystem::is_directory(dir, ec),
              "run directory {}: exists and is not a directory", dir);
  std::filesystem::create_directories(dir, ec);
  VQDDP_CHECK(!ec, "run directory {}: cannot create it: {}", dir, ec.message());
  // A probe file rather than access(W_OK): it also catches a read-only
  // mount, a full inode table and ACLs the permission bits do not show.
  std::string probe = (std::filesystem::path(dir) / fmt::format(".write-test.{}", ::getpid())).string();
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  VQDDP_CHECK(fd >= 0, "run directory {}: cannot write in it: {}", dir, std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) == 0) {
    int64_t free_bytes = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
    VQDDP_CHECK(free_bytes >= checkpoint_bytes, "run directory {}: {} free, a checkpoint of this run needs {}", dir,
                mib(free_bytes), mib(checkpoint_bytes));
  }
}

}  // namespace vqddp
