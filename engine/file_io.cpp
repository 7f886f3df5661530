#include "engine/file_io.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string_view>

#include "engine/error.h"
#include "engine/parse_number.h"

namespace vqddp {

namespace {
struct FileClose {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
}  // namespace

namespace {

// What a stat mode is, for a message: "is a FIFO, not a regular file".
const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

void check_regular(const std::string& path, const struct stat& st) {
  VQDDP_CHECK(S_ISREG(st.st_mode), "{}: is {}, not a regular file: vqddp reads files only", path, file_kind(st.st_mode));
}

}  // namespace

void require_regular_file(const std::string& path) {
  struct stat st {};
  VQDDP_CHECK(::stat(path.c_str(), &st) == 0, "{}: cannot open for reading: {}", path, std::strerror(errno));
  check_regular(path, st);
}

std::string read_file(const std::string& path, int64_t max_bytes, const char* what) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  VQDDP_CHECK(fd >= 0, "{}: cannot open for reading: {}", path, std::strerror(errno));
  std::unique_ptr<std::FILE, FileClose> f(::fdopen(fd, "rb"));
  if (!f) {
    int err = errno;
    ::close(fd);
    VQDDP_THROW("{}: cannot open for reading: {}", path, std::strerror(err));
  }
  struct stat st {};
  VQDDP_CHECK(::fstat(fd, &st) == 0, "{}: cannot stat: {}", path, std::strerror(errno));
  check_regular(path, st);
  VQDDP_CHECK(max_bytes < 0 || st.st_size <= max_bytes, "{}: {} bytes, more than the {} bytes {} may have", path,
              static_cast<int64_t>(st.st_size), max_bytes, what);
  std::string bytes;
  char buf[1 << 16];
  size_t r;
  while ((r = std::fread(buf, 1, sizeof buf, f.get())) > 0) {
    bytes.append(buf, r);
    // A file that grows while it is read is held to the same limit.
    VQDDP_CHECK(max_bytes < 0 || static_cast<int64_t>(bytes.size()) <= max_bytes,
                "{}: more than the {} bytes {} may have", path, max_bytes, what);
  }
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

namespace {

// The pid in a temporary's name after "<path>.tmp.": "<pid>.<8 hex digits>",
// as write_file_atomic makes them; 0 for any other name, which is left alone.
pid_t temporary_pid(std::string_view rest) {
  size_t dot = rest.find('.');
  if (dot == std::string_view::npos || rest.size() - dot - 1 != 8) return 0;
  for (char c : rest.substr(dot + 1))
    if (!std::isxdigit(static_cast<unsigned char>(c))) return 0;
  std::optional<int64_t> pid = parse_int(rest.substr(0, dot));
  return pid && *pid > 0 && *pid <= INT32_MAX ? static_cast<pid_t>(*pid) : 0;
}

// ESRCH only: EPERM means the process exists (another user's), so its file
// may still be in the middle of a write.
bool writer_is_gone(pid_t pid) { return pid == ::getpid() || (::kill(pid, 0) != 0 && errno == ESRCH); }

}  // namespace

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
    pid_t pid = temporary_pid(std::string_view(name).substr(prefix.size()));
    if (pid > 0 && writer_is_gone(pid)) stale.push_back(e.path().string());
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

namespace {

// Slicing-by-8: kCrcTables[0] is the byte-at-a-time table of the reflected
// Castagnoli polynomial; kCrcTables[k][b] is the CRC of byte b followed by k
// zero bytes, so eight lookups consume eight bytes at once. Portable (no
// SSE4.2 crc32 instruction), the same result on every machine, and fast
// enough (~2 GB/s) that a checkpoint's checksums cost little next to fsync.
constexpr std::array<std::array<uint32_t, 256>, 8> make_crc_tables() {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int i = 0; i < 8; ++i) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
    t[0][b] = c;
  }
  for (int k = 1; k < 8; ++k)
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  return t;
}
constexpr auto kCrcTables = make_crc_tables();

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  static_assert(std::endian::native == std::endian::little, "crc32c reads 8 bytes as one little-endian word");
  const auto& t = kCrcTables;
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= crc;
    crc = t[7][w & 0xff] ^ t[6][(w >> 8) & 0xff] ^ t[5][(w >> 16) & 0xff] ^ t[4][(w >> 24) & 0xff] ^
          t[3][(w >> 32) & 0xff] ^ t[2][(w >> 40) & 0xff] ^ t[1][(w >> 48) & 0xff] ^ t[0][w >> 56];
  }
  for (; n > 0; --n, ++p) crc = (crc >> 8) ^ t[0][(crc ^ *p) & 0xff];
  return ~crc;
}

}  // namespace vqddp
