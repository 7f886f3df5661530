#include "data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include "engine/core/error.h"
#include "engine/core/file_io.h"

namespace vqddp {

namespace {

constexpr unsigned char kTypeUbyte = 0x08;

const char* idx_type_name(unsigned char type) {
  switch (type) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "int16";
    case 0x0C: return "int32";
    case 0x0D: return "float32";
    case 0x0E: return "float64";
    default: return nullptr;
  }
}

struct GzClose {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzClose>;

// Reads up to `len` bytes; a short count means end of input. zlib reports
// corruption through gzerror, sometimes only after returning the bytes it
// decoded, so it is asked after every read.
size_t gz_read(const std::string& path, gzFile f, void* buf, size_t len) {
  size_t got = 0;
  while (got < len) {
    // gzread takes an unsigned count and returns int: at most INT_MAX per call.
    unsigned want = static_cast<unsigned>(std::min<size_t>(len - got, 1u << 30));
    int r = gzread(f, static_cast<char*>(buf) + got, want);
    int err = Z_OK;
    std::string msg = gzerror(f, &err);
    VQDDP_CHECK(err != Z_ERRNO, "{}: read error: {}", path, std::strerror(errno));
    // zlib prefixes its message with the path, which ours already names.
    if (msg.starts_with(path + ": ")) msg.erase(0, path.size() + 2);
    // Z_BUF_ERROR is zlib's "unexpected end of file": truncation, reported by the caller.
    VQDDP_CHECK(r >= 0 && (err == Z_OK || err == Z_BUF_ERROR), "{}: corrupt gzip data: {}", path, msg);
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

// True when the gzip stream ended without its trailer, not at a clean end.
bool gz_cut_off(gzFile f) {
  int err = Z_OK;
  gzerror(f, &err);
  return err == Z_BUF_ERROR;
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  require_regular_file(path);  // gzopen would block on a FIFO
  errno = 0;
  GzFile f(gzopen(path.c_str(), "rb"));
  VQDDP_CHECK(f, "{}: cannot open for reading: {}", path, errno ? std::strerror(errno) : "out of memory");
  gzbuffer(f.get(), 1 << 17);

  unsigned char magic[4];
  size_t got = gz_read(path, f.get(), magic, 4);
  VQDDP_CHECK(got == 4, "{}: {} bytes, too short for an IDX header", path, got);
  VQDDP_CHECK(magic[0] == 0 && magic[1] == 0, "{}: bad magic {:#04x} {:#04x} (an IDX file starts with 0x00 0x00)", path,
              magic[0], magic[1]);
  if (magic[2] != kTypeUbyte) {
    const char* name = idx_type_name(magic[2]);
    VQDDP_THROW("{}: type {:#04x} ({}), vqddp reads unsigned-byte (0x08) IDX only", path, magic[2],
                name ? name : "not an IDX type");
  }

  IdxArray out;
  const int ndim = magic[3];
  for (int i = 0; i < ndim; ++i) {
    unsigned char d[4];
    VQDDP_CHECK(gz_read(path, f.get(), d, 4) == 4, "{}: header is cut off in the size of dimension {} of {}", path, i,
                ndim);
    out.shape.push_back(int64_t{d[0]} << 24 | int64_t{d[1]} << 16 | int64_t{d[2]} << 8 | int64_t{d[3]});
  }
  int64_t numel = 0;
  try {
    numel = shape_numel(out.shape);
  } catch (const Error&) {
    VQDDP_THROW("{}: shape {} has more elements than int64 holds", path, shape_str(out.shape));
  }

  // Grow the buffer as data arrives, so a corrupt header claiming terabytes
  // fails at the end of the file rather than in the allocator.
  const size_t need = static_cast<size_t>(numel);
  size_t have = 0;
  while (have < need) {
    size_t step = std::min<size_t>(need - have, size_t{1} << 26);
    out.data.resize(have + step);
    size_t r = gz_read(path, f.get(), out.data.data() + have, step);
    have += r;
    VQDDP_CHECK(r == step, "{}: data truncated: shape {} needs {} bytes, the file holds {}{}", path,
                shape_str(out.shape), need, have, gz_cut_off(f.get()) ? " (its gzip stream is cut off)" : "");
  }
  unsigned char extra;
  VQDDP_CHECK(gz_read(path, f.get(), &extra, 1) == 0, "{}: bytes left after the {} bytes that shape {} needs", path,
              need, shape_str(out.shape));
  return out;
}

}  // namespace vqddp
