#include "train/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "engine/core/error.h"

namespace vqddp {

namespace {

// The pid written into the lock file by the run that holds it ("" if none).
std::string holder(int fd) {
  char buf[32] = {};
  ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// What a file that should be a lone regular file is instead.
std::string what_file(const struct stat& st) {
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return "a device";
  if (S_ISLNK(st.st_mode)) return "a symbolic link";
  if (!S_ISREG(st.st_mode)) return "not a regular file";
  return st.st_nlink != 1 ? fmt::format("a file with {} hard links", st.st_nlink) : "a regular file";
}

}  // namespace

std::string mib(int64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / 1048576.0); }

namespace {

// A descriptor closed on scope exit unless released.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
  int release() { return std::exchange(fd, -1); }
};

// The run directory, created if missing, and its lock: the lock file
// opened, flocked and given this process's pid. Returns its descriptor.
int take_lock(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  VQDDP_CHECK(!fs::exists(dir, ec) || fs::is_directory(dir, ec), "run directory {}: exists and is not a directory",
              dir);
  VQDDP_CHECK(fs::exists(dir, ec) || !fs::is_symlink(fs::symlink_status(dir, ec)), "run directory {}: is a symbolic "
              "link to {}, which does not exist", dir, fs::read_symlink(dir, ec).string());
  fs::create_directories(dir, ec);
  VQDDP_CHECK(!ec, "run directory {}: cannot create it: {}", dir, ec.message());
  // The lock file doubles as the write probe (rather than access(W_OK): it
  // also catches a read-only mount, a full inode table and ACLs the
  // permission bits do not show).
  std::string lock = (fs::path(dir) / ".lock").string();
  // Held in a guard until every check passed: a refused start releases it.
  FdGuard fd{::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644)};
  // O_NOFOLLOW: a link planted at .lock would otherwise have its target
  // truncated to our pid (or a file created wherever a dangling one
  // points); O_NONBLOCK: a FIFO there must not block the open. Nothing is
  // written before the checks below.
  struct stat st {};
  if (fd.fd < 0) {
    const int error = errno;
    VQDDP_CHECK(::lstat(lock.c_str(), &st) != 0 || S_ISREG(st.st_mode), "run directory {}: {} is {}, not the run's "
                "own lock file (remove it)", dir, lock, what_file(st));
    VQDDP_THROW("run directory {}: cannot write in it: {} (its lock file {})", dir, std::strerror(error), lock);
  }
  VQDDP_CHECK(::fstat(fd.fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1, "run directory {}: {} is {}, not "
              "the run's own lock file (remove it)", dir, lock, what_file(st));
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
  return fd.release();
}

// A fresh run is refused where a run's files are; an overwrite removes them.
void claim_run_files(const std::string& dir, RunStart start) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string held;
  for (const char* name : kRunFiles)
    if (fs::exists(fs::path(dir) / name, ec)) held += fmt::format("{}{}", held.empty() ? "" : ", ", name);
  if (!held.empty() && start == RunStart::fresh)
    VQDDP_THROW("run directory {} already holds a run ({}); continue it with --resume {}, start this run in "
                "another directory with --dir, or replace the old run with --overwrite",
                dir, held, (fs::path(dir) / kRunFiles[0]).string());
  if (start == RunStart::unsaved) {
    VQDDP_CHECK(!fs::exists(fs::path(dir) / kRunFiles[0], ec),
                "run directory {}: --resume auto found no {} when it chose to start afresh, and now there is one "
                "(a file system that showed it late?): start again, and it will be resumed",
                dir, kRunFiles[0]);
    fs::remove(fs::path(dir) / kRunFiles[1], ec);
    VQDDP_CHECK(!ec, "run directory {}: cannot remove the unsaved run's {}: {}", dir, kRunFiles[1], ec.message());
  }
  if (start == RunStart::overwrite)
    for (const char* name : kRunFiles) {
      fs::remove(fs::path(dir) / name, ec);
      VQDDP_CHECK(!ec, "run directory {}: cannot remove the old run's {}: {}", dir, name, ec.message());
    }
}

}  // namespace

RunDir::RunDir(const std::string& dir, int64_t checkpoint_bytes, RunStart start, bool reserve) : dir_(dir) {
  VQDDP_CHECK(!dir.empty(), "the run directory is \"\" (set run.dir or --dir)");
  namespace fs = std::filesystem;
  FdGuard fd{take_lock(dir)};  // released (closed) if the start is refused
  claim_run_files(dir, start);
  lock_fd_ = fd.release();
  // The reserve a run left (killed, or stopped for a full disk) is room
  // this one may count as free.
  reserve_path_ = (fs::path(dir) / ".reserve").string();
  release_reserve();
  struct stat left {};
  if (::lstat(reserve_path_.c_str(), &left) == 0) {  // not removable by unlink: a directory
    ::close(lock_fd_);
    lock_fd_ = -1;
    VQDDP_THROW("run directory {}: {} is {}, not the run's own reserve (remove it)", dir, reserve_path_,
                what_file(left));
  }
  const int64_t free = free_bytes();
  auto refuse_room = [&](int64_t have) {
    ::close(lock_fd_);
    lock_fd_ = -1;
    VQDDP_THROW("run directory {}: {} free, a checkpoint of this run needs {}", dir, mib(have), mib(checkpoint_bytes));
  };
  if (free >= 0 && free < checkpoint_bytes) refuse_room(free);
  if (reserve && checkpoint_bytes > 0) {
    reserve_bytes_ = checkpoint_bytes;
    if (!hold_reserve()) refuse_room(free_bytes());
  }
}

int64_t RunDir::free_bytes() const {
  struct statvfs vfs {};
  if (::statvfs(dir_.c_str(), &vfs) != 0) return -1;
  return static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize);
}

void RunDir::release_reserve() {
  // unlink, never through a link: it removes whatever name is there, and
  // only inside the run directory.
  ::unlink(reserve_path_.c_str());
  reserve_held_ = false;
}

bool RunDir::hold_reserve() {
  if (reserve_bytes_ == 0) return true;
  release_reserve();
  // O_EXCL | O_NOFOLLOW: a name planted after the unlink is refused, never
  // followed; posix_fallocate takes the blocks without writing them.
  int fd = ::open(reserve_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  const bool held = ::posix_fallocate(fd, 0, reserve_bytes_) == 0;
  ::close(fd);
  if (!held) ::unlink(reserve_path_.c_str());  // a part of the room is no room: give it back
  reserve_held_ = held;
  return held;
}

bool RunDir::disk_low() const {
  if (reserve_bytes_ == 0) return false;  // no checkpoints: nothing a stop could save
  if (!reserve_held_) return true;
  const int64_t free = free_bytes();
  return free >= 0 && free < kDiskMargin;
}

std::string run_subdir(const std::string& dir, const char* name) {
  namespace fs = std::filesystem;
  const std::string sub = (fs::path(dir) / name).string();
  // mkdir, not create_directories: it never follows a link at `sub`; what
  // is there already is then checked without following it either.
  if (::mkdir(sub.c_str(), 0755) != 0) {
    VQDDP_CHECK(errno == EEXIST, "{}: cannot create it: {}", sub, std::strerror(errno));
    struct stat st {};
    VQDDP_CHECK(::lstat(sub.c_str(), &st) == 0, "{}: {}", sub, std::strerror(errno));
    VQDDP_CHECK(!S_ISLNK(st.st_mode), "{}: is a symbolic link; a run writes only into its own directory, never "
                "through a link (remove it)", sub);
    VQDDP_CHECK(S_ISDIR(st.st_mode), "{}: is {}, not a directory (remove it)", sub, what_file(st));
  }
  return sub;
}

RunDir::~RunDir() {
  if (lock_fd_ >= 0 && reserve_bytes_ > 0) release_reserve();  // the room is the user's again
  if (lock_fd_ >= 0) ::close(lock_fd_);  // closing the last descriptor releases the flock
  lock_fd_ = -1;
}

}  // namespace vqddp
