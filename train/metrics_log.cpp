#include "train/metrics_log.h"

#include "train/console.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>

#include <fmt/format.h>

#include "engine/core/error.h"
#include "engine/core/file_io.h"
#include "engine/core/output_file.h"

namespace vqddp {

namespace {

// The lines of `text` a resume at `step` keeps: whole JSON objects with a
// step no later than it.
std::string lines_up_to(const std::string& text, int64_t step) {
  std::istringstream in(text);
  std::string line, kept;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() <= step)
      kept += line + "\n";
  }
  return kept;
}

// An append log, the one file not replaced whole (engine/core/output_file.h):
// O_NOFOLLOW, so a symbolic link planted under its name is refused rather
// than followed to whatever it points at, for reading (a resume copies its
// lines) as for writing; O_NONBLOCK, so a FIFO under its name cannot hang
// the open before fstat refuses it.
int open_log(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  VQDDP_CHECK(fd >= 0, "{}: cannot open the metrics file for writing: {}", path,
              errno == ELOOP ? "it is a symbolic link (vqddp reads and writes its run files itself, never through a link)"
                             : std::strerror(errno));
  // One link only: a hard link planted there would have the run's lines
  // appended to a file outside the run.
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) {
    ::close(fd);
    VQDDP_THROW("{}: the metrics file is not a regular file of the run's own{}", path,
                S_ISREG(st.st_mode) && st.st_nlink > 1 ? fmt::format(" (it has {} hard links)", st.st_nlink) : "");
  }
  return fd;
}

std::string read_all(int fd, const std::string& path) {
  std::string text;
  char buf[1 << 16];
  for (off_t at = 0;;) {
    ssize_t n = ::pread(fd, buf, sizeof buf, at);
    if (n < 0 && errno == EINTR) continue;
    VQDDP_CHECK(n >= 0, "{}: cannot read the metrics file: {}", path, std::strerror(errno));
    if (n == 0) return text;
    text.append(buf, static_cast<size_t>(n));
    at += n;
  }
}

}  // namespace

MetricsLog::MetricsLog(std::string path, int64_t resume_step) : path_(std::move(path)) {
  fd_ = open_log(path_);
  if (resume_step < 0) return;
  const std::string text = read_all(fd_, path_);
  const std::string kept = lines_up_to(text, resume_step);
  if (kept == text) return;
  // Replaced whole, so a kill midway leaves the old log; then reopened, as
  // the replacement is a new file.
  ::close(fd_);
  fd_ = -1;
  write_file_atomic(path_, kept);
  fd_ = open_log(path_);
}

MetricsLog::~MetricsLog() {
  if (lost_ > 0)
    console_line(stderr, "vqddp: warning: {} line{} of {} could not be written and are missing from it\n", lost_,
               lost_ == 1 ? "" : "s", path_);
  if (fd_ >= 0) ::close(fd_);
}

void MetricsLog::write(const nlohmann::json& line) {
  std::string text = (fragment_ ? "\n" : "") + line.dump() + "\n";
  off_t before = ::lseek(fd_, 0, SEEK_END);
  size_t done = 0;
  int err = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : ENOSPC;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (!err) {
    fragment_ = false;
    return;
  }
  // No half line: a reader of the file (or the resume above) sees whole
  // lines only. If even that fails, the next line starts on a line of its
  // own, after the fragment, which the resume filter drops.
  if (done > 0 && (before < 0 || ::ftruncate(fd_, before) != 0)) fragment_ = true;
  if (lost_++ == 0)
    console_line(stderr, "vqddp: warning: {}: cannot write the metrics line of step {} ({}); training goes on, lost lines "
               "are counted\n", path_, line.value("step", int64_t{-1}), std::strerror(err));
}

}  // namespace vqddp
