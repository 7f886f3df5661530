#include "engine/core/file_io.h"

#include <fcntl.h>
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
#include <string_view>

#include "engine/core/error.h"
#include "engine/core/parse_number.h"

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
