#include "engine/core/output_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string_view>

#include "engine/core/error.h"
#include "engine/core/parse_number.h"

namespace vqddp {

namespace {

// The live temporaries, twice: a set under a mutex for the stale check
// (which must not take this process's own writes for a dead one's), and
// fixed slots a signal handler can read without locking or allocating.
// A temporary whose path does not fit a slot, or beyond the slots, is not
// removed on a signal; the next write of its destination removes it.
//
// A slot is listed (kOpening) before its open() and live once it returns.
// A handler on another thread waits for an open() in progress, or it could
// unlink the name just before that open() creates it and the process would
// end with the file in place. The wait cannot miss one: the handler sets
// g_stopping before it reads the slots, a writer lists its slot before it
// reads g_stopping (both sequentially consistent), so either the handler
// sees the slot or the writer sees g_stopping and makes no file.
constexpr int kSlots = 64;
constexpr size_t kSlotBytes = 4096;
enum SlotState : int { kFree = 0, kFilling = 1, kOpening = 2, kLive = 3 };
struct Slot {
  std::atomic<int> state{kFree};
  std::atomic<pid_t> opener{0};  // the thread whose open() kOpening waits for
  char path[kSlotBytes];
};
Slot g_slots[kSlots];
std::atomic<bool> g_stopping{false};

std::mutex g_live_mutex;
std::set<std::string>& live_set() {
  static std::set<std::string> live;
  return live;
}

int claim_slot(const std::string& temp) {
  if (temp.size() + 1 > kSlotBytes) return -1;
  for (int i = 0; i < kSlots; ++i) {
    int expected = kFree;
    if (!g_slots[i].state.compare_exchange_strong(expected, kFilling)) continue;
    std::memcpy(g_slots[i].path, temp.c_str(), temp.size() + 1);
    g_slots[i].opener.store(::gettid());
    g_slots[i].state.store(kOpening);
    return i;
  }
  return -1;
}

void release_slot(int slot) {
  if (slot >= 0) g_slots[slot].state.store(kFree);
}

std::string directory_of(const std::string& path) {
  const std::filesystem::path p(path);
  return p.has_parent_path() ? p.parent_path().string() : std::string(".");
}

// The random part of a temporary's name: 64 bits, 16 hex digits.
std::string random_hex() {
  std::random_device rd;
  const uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return fmt::format("{:016x}", v);
}

// The pid in a temporary's name after "<name>.tmp.": "<pid>.<hex>", with 16
// hex digits (OutputFile) or 8 (the writer before it); 0 for any other
// name, which is left alone.
pid_t temporary_pid(std::string_view rest) {
  size_t dot = rest.find('.');
  if (dot == std::string_view::npos) return 0;
  const size_t digits = rest.size() - dot - 1;
  if (digits != 8 && digits != 16) return 0;
  for (char c : rest.substr(dot + 1))
    if (!std::isxdigit(static_cast<unsigned char>(c))) return 0;
  std::optional<int64_t> pid = parse_int(rest.substr(0, dot));
  return pid && *pid > 0 && *pid <= INT32_MAX ? static_cast<pid_t>(*pid) : 0;
}

// ESRCH only: EPERM means the process exists (another user's), so its file
// may still be in the middle of a write. This process's own pid is an
// earlier process's unless one of our live writers holds the file.
bool writer_is_gone(pid_t pid, const std::string& file) {
  if (pid == ::getpid()) {
    std::lock_guard<std::mutex> lock(g_live_mutex);
    return live_set().count(file) == 0;
  }
  return ::kill(pid, 0) != 0 && errno == ESRCH;
}

void fsync_directory(const std::string& dir) {
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return;
  ::fsync(dfd);
  ::close(dfd);
}

void on_signal(int sig) {
  remove_live_temporaries();
  ::signal(sig, SIG_DFL);
  ::raise(sig);  // delivered as the handler returns: the default action, the status says which signal
}

}  // namespace

OutputFile::OutputFile(std::string path, bool remove_stale) : path_(std::move(path)) {
  VQDDP_CHECK(!path_.empty(), "cannot write a file with an empty name");
  if (remove_stale) remove_stale_temporaries(path_);
  std::string name = std::filesystem::path(path_).filename().string();
  VQDDP_CHECK(!name.empty() && name != "." && name != "..", "{}: names a directory, not a file to write", path_);
  // A few tries: a name already taken is either a planted file or a
  // 2^-64 collision, and neither is followed.
  for (int attempt = 0; attempt < 4 && fd_ < 0; ++attempt) {
    temp_ = fmt::format("{}.tmp.{}.{}", path_, ::getpid(), random_hex());
    {
      std::lock_guard<std::mutex> lock(g_live_mutex);
      live_set().insert(temp_);
    }
    // Listed for the signal handler before it exists: a signal between
    // open() and the listing would leave the file behind (the handler
    // unlinking a name not yet made is harmless; one on another thread
    // waits for this open(): see Slot). A name that exists
    // already is 64 random bits guessed, so no one's file is at stake.
    slot_ = claim_slot(temp_);
    if (g_stopping.load()) {
      // A handler has removed the temporaries and is ending the process:
      // make no file it would leave behind. Waits for the end; throws only
      // if the process outlives the wait (a handler that did not end it).
      release_slot(slot_);
      slot_ = -1;
      {
        std::lock_guard<std::mutex> lock(g_live_mutex);
        live_set().erase(temp_);
      }
      for (int i = 0; i < 1000; ++i) ::usleep(10000);
      VQDDP_THROW("{}: not written: the process is stopping on a signal", path_);
    }
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (slot_ >= 0) g_slots[slot_].state.store(kLive);
    if (fd_ < 0) {
      const int err = errno;
      release_slot(slot_);
      slot_ = -1;
      {
        std::lock_guard<std::mutex> lock(g_live_mutex);
        live_set().erase(temp_);
      }
      if (err == EEXIST) continue;
      if (err == ENOENT)
        VQDDP_THROW("{}: cannot write: the directory {} does not exist", path_, directory_of(path_));
      VQDDP_THROW("{}: cannot create a temporary file in {} to write it: {}", path_, directory_of(path_),
                  std::strerror(err));
    }
  }
  VQDDP_CHECK(fd_ >= 0, "{}: cannot create a temporary file next to it: every name tried exists", path_);
}

OutputFile::~OutputFile() { discard(); }

void OutputFile::discard() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (temp_.empty()) return;
  ::unlink(temp_.c_str());
  release_slot(slot_);
  slot_ = -1;
  std::lock_guard<std::mutex> lock(g_live_mutex);
  live_set().erase(temp_);
  temp_.clear();
}

void OutputFile::write(const void* data, size_t n) {
  VQDDP_CHECK(fd_ >= 0, "{}: written after it was committed", path_);
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = w == 0 ? EIO : errno;
      discard();
      VQDDP_THROW("{}: write failed: {}", path_, std::strerror(err));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void OutputFile::commit() {
  VQDDP_CHECK(fd_ >= 0, "{}: committed twice", path_);
  int err = 0;
  while (::fsync(fd_) != 0) {
    if (errno == EINTR) continue;
    err = errno;
    break;
  }
  if (::close(fd_) != 0 && err == 0) err = errno;
  fd_ = -1;
  if (err == 0 && ::rename(temp_.c_str(), path_.c_str()) != 0) err = errno;
  if (err != 0) {
    discard();
    VQDDP_THROW("{}: cannot write it and rename the temporary into place: {}", path_, std::strerror(err));
  }
  release_slot(slot_);
  slot_ = -1;
  {
    std::lock_guard<std::mutex> lock(g_live_mutex);
    live_set().erase(temp_);
  }
  temp_.clear();
  fsync_directory(directory_of(path_));  // the rename itself durable
}

OutputDir::OutputDir(std::string dir, std::string command) : dir_(std::move(dir)), command_(std::move(command)) {
  VQDDP_CHECK(!dir_.empty(), "{}: --out is empty: name the directory the outputs go to", command_);
  std::error_code ec;
  const auto st = std::filesystem::status(dir_, ec);
  VQDDP_CHECK(!std::filesystem::exists(st) || std::filesystem::is_directory(st), "{}: --out {}: exists and is not a "
              "directory", command_, dir_);
}

OutputDir::~OutputDir() {
  if (kept_) return;
  for (auto it = made_.rbegin(); it != made_.rend(); ++it) {
    std::error_code ec;
    std::filesystem::remove(*it, ec);  // only an empty directory goes; a failure leaves it
  }
}

std::string OutputDir::path_for(const std::string& name, bool overwrite) const {
  const std::string path = (std::filesystem::path(dir_) / name).string();
  std::error_code ec;
  const auto st = std::filesystem::symlink_status(path, ec);
  if (!std::filesystem::exists(st)) return path;
  VQDDP_CHECK(!std::filesystem::is_directory(st), "{}: is a directory; {} writes a file of that name", path, command_);
  VQDDP_CHECK(overwrite, "{}: exists already{}; {} --overwrite replaces it", path,
              std::filesystem::is_symlink(st) ? " (a symbolic link, which --overwrite replaces, not what it points to)"
                                              : "", command_);
  return path;
}

void OutputDir::create() {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(dir_, ec)) return;
  std::vector<fs::path> missing;
  for (fs::path p = fs::path(dir_).lexically_normal(); !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    missing.push_back(p);
    if (p == p.parent_path()) break;
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (fs::create_directory(*it, ec)) {
      made_.push_back(it->string());
    } else {
      VQDDP_CHECK(!ec, "{}: cannot make the directory {}: {}", command_, it->string(), ec.message());
    }
  }
  VQDDP_CHECK(fs::is_directory(dir_, ec), "{}: --out {} is not a directory{}", command_, dir_,
              ec ? fmt::format(" ({})", ec.message()) : "");
}

void write_file_atomic(const std::string& path, const std::string& bytes, bool remove_stale) {
  OutputFile f(path, remove_stale);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

std::vector<std::string> remove_stale_temporaries(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string prefix = target.filename().string() + ".tmp.";
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec == std::errc::no_such_file_or_directory) return {};  // nothing was ever written there
  VQDDP_CHECK(!ec, "{}: cannot list {} for stale temporary files: {}", path, dir.string(), ec.message());
  // Listed first, removed after: removing while iterating may skip entries.
  std::vector<std::string> stale;
  for (const fs::directory_entry& e : it) {
    std::string name = e.path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    // Spelled as OutputFile spells its temporaries ("x.tmp...", not "./x.tmp..."),
    // so that this process's live ones are found in its set.
    const std::string rest = name.substr(prefix.size()), file = path + ".tmp." + rest;
    pid_t pid = temporary_pid(rest);
    if (pid > 0 && writer_is_gone(pid, file)) stale.push_back(file);
  }
  std::vector<std::string> removed;
  for (const std::string& file : stale) {
    if (::unlink(file.c_str()) == 0) {
      removed.push_back(file);
    } else {
      VQDDP_CHECK(errno == ENOENT, "{}: cannot remove the stale temporary file {}: {}", path, file, std::strerror(errno));
    }
  }
  return removed;
}

void remove_live_temporaries() noexcept {
  g_stopping.store(true);
  const pid_t self = ::gettid();
  int wait_ms = 2000;  // for all slots together: a hung open() delays the end by 2 s, not 2 s a slot
  for (Slot& s : g_slots) {
    int state = s.state.load();
    // Another thread's open() in progress: wait for it, so that the file it
    // creates is removed here. Not this thread's own: the handler
    // interrupted it, and it resumes only if the process does.
    for (; wait_ms > 0 && state == kOpening && s.opener.load() != self; --wait_ms) {
      const timespec ms{0, 1000000};
      ::nanosleep(&ms, nullptr);  // async-signal-safe
      state = s.state.load();
    }
    if (state == kOpening || state == kLive) ::unlink(s.path);
  }
}

void remove_temporaries_on_signal() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

}  // namespace vqddp
