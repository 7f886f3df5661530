#include "train/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "engine/core/error.h"

namespace vqddp {

namespace {

std::string mib(int64_t bytes) { return fmt::format("{:.1f} MiB", bytes / 1048576.0); }

// The pid written into the lock file by the run that holds it ("" if none).
std::string holder(int fd) {
  char buf[32] = {};
  ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

}  // namespace

RunDir::RunDir(const std::string& dir, int64_t checkpoint_bytes, RunStart start) {
  VQDDP_CHECK(!dir.empty(), "the run directory is \"\" (set run.dir or --dir)");
  namespace fs = std::filesystem;
  std::error_code ec;
  VQDDP_CHECK(!fs::exists(dir, ec) || fs::is_directory(dir, ec), "run directory {}: exists and is not a directory",
              dir);
  fs::create_directories(dir, ec);
  VQDDP_CHECK(!ec, "run directory {}: cannot create it: {}", dir, ec.message());
  // The lock file doubles as the write probe (rather than access(W_OK): it
  // also catches a read-only mount, a full inode table and ACLs the
  // permission bits do not show).
  std::string lock = (fs::path(dir) / ".lock").string();
  // Held in a guard until every check passed: a refused start releases it.
  struct Guard {
    int fd;
    ~Guard() {
      if (fd >= 0) ::close(fd);
    }
  } fd{::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)};
  VQDDP_CHECK(fd.fd >= 0, "run directory {}: cannot write in it: {}", dir, std::strerror(errno));
  if (::flock(fd.fd, LOCK_EX | LOCK_NB) != 0) {
    std::string pid = holder(fd.fd);
    VQDDP_THROW("run directory {}: another run is writing to it{}; wait for it to end, or give this one another "
                "directory (--dir)",
                dir, pid.empty() ? "" : fmt::format(" (process {})", pid));
  }
  std::string pid = std::to_string(::getpid());
  bool written = ::ftruncate(fd.fd, 0) == 0 &&
                 ::pwrite(fd.fd, pid.data(), pid.size(), 0) == static_cast<ssize_t>(pid.size());
  VQDDP_CHECK(written, "run directory {}: cannot write in it: {}", dir, std::strerror(errno));

  std::string held;
  for (const char* name : kRunFiles)
    if (fs::exists(fs::path(dir) / name, ec)) held += fmt::format("{}{}", held.empty() ? "" : ", ", name);
  if (!held.empty() && start == RunStart::fresh)
    VQDDP_THROW("run directory {} already holds a run ({}); continue it with --resume {}, start this run in "
                "another directory with --dir, or replace the old run with --overwrite",
                dir, held, (fs::path(dir) / kRunFiles[0]).string());
  if (start == RunStart::overwrite)
    for (const char* name : kRunFiles) {
      fs::remove(fs::path(dir) / name, ec);
      VQDDP_CHECK(!ec, "run directory {}: cannot remove the old run's {}: {}", dir, name, ec.message());
    }

  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) == 0) {
    int64_t free_bytes = static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize);
    VQDDP_CHECK(free_bytes >= checkpoint_bytes, "run directory {}: {} free, a checkpoint of this run needs {}", dir,
                mib(free_bytes), mib(checkpoint_bytes));
  }
  lock_fd_ = fd.fd;
  fd.fd = -1;
}

RunDir::~RunDir() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // closing the last descriptor releases the flock
  lock_fd_ = -1;
}

}  // namespace vqddp
