#include "data/wav.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>

#include "engine/error.h"
#include "engine/file_io.h"

namespace vqddp {

namespace {

constexpr uint16_t kFormatPcm = 1;
constexpr uint16_t kFormatExtensible = 0xFFFE;
constexpr uint32_t kSizeUnknown = 0xFFFFFFFF;

// Byte-wise little-endian loads: correct on any host, and `p` need not be aligned.
uint16_t le16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
uint32_t le32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

// Checks the "fmt " chunk body and returns the sample rate.
int parse_fmt(const std::string& path, const unsigned char* p, uint32_t size) {
  VQDDP_CHECK(size >= 16, "{}: fmt chunk of {} bytes is too short (it needs at least 16)", path, size);
  uint16_t tag = le16(p);
  uint16_t channels = le16(p + 2);
  uint32_t rate = le32(p + 4);
  uint16_t block_align = le16(p + 12);
  uint16_t bits = le16(p + 14);
  if (tag == kFormatExtensible) {
    // cbSize, valid bits and channel mask precede the 16-byte subformat GUID,
    // whose first two bytes are the plain format tag it stands for.
    VQDDP_CHECK(size >= 40, "{}: extensible fmt chunk of {} bytes is too short (it needs 40)", path, size);
    uint16_t sub = le16(p + 24);
    VQDDP_CHECK(sub == kFormatPcm, "{}: format tag 0xFFFE (extensible) with subformat {} (not PCM)", path, sub);
  } else {
    VQDDP_CHECK(tag == kFormatPcm, "{}: format tag {} (not PCM), vqddp reads 16-bit PCM only", path, tag);
  }
  VQDDP_CHECK(channels == 1, "{}: {} channels, vqddp reads mono WAV only", path, channels);
  VQDDP_CHECK(bits == 16, "{}: {} bits per sample, vqddp reads 16-bit PCM only", path, bits);
  VQDDP_CHECK(block_align == 2, "{}: block align {} bytes, but one 16-bit mono sample is 2", path, block_align);
  VQDDP_CHECK(rate > 0 && rate <= INT_MAX, "{}: sample rate {} Hz is not a usable rate", path, rate);
  return static_cast<int>(rate);
}

}  // namespace

WavAudio read_wav(const std::string& path) {
  // RIFF sizes are 32-bit: a WAV file is at most 4 GiB and its 8-byte header.
  std::string bytes = read_file(path, (int64_t{1} << 32) + 8, "a WAV file");
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  VQDDP_CHECK(n >= 12 && std::memcmp(b, "RIFF", 4) == 0 && std::memcmp(b + 8, "WAVE", 4) == 0,
              "{}: not a RIFF/WAVE file (it does not start with 'RIFF', size, 'WAVE')", path);

  WavAudio out;
  bool have_fmt = false;
  size_t pos = 12;
  while (true) {
    VQDDP_CHECK(pos < n, "{}: no {} chunk", path, have_fmt ? "data" : "fmt");
    VQDDP_CHECK(n - pos >= 8, "{}: chunk header at offset {} is cut off by the end of the file: file truncated", path,
                pos);
    std::string id(bytes, pos, 4);
    uint32_t size = le32(b + pos + 4);
    size_t body = pos + 8;
    size_t left = n - body;
    if (id == "data") {
      VQDDP_CHECK(have_fmt, "{}: data chunk comes before the fmt chunk", path);
      // A writer that streams does not know the size: 0xFFFFFFFF means "to
      // the end of the file". Any other size must be there in full: a file
      // cut short (an interrupted copy) is refused rather than read in part.
      if (size == kSizeUnknown) size = static_cast<uint32_t>(std::min<size_t>(left - left % 2, kSizeUnknown - 1));
      VQDDP_CHECK(size % 2 == 0, "{}: data chunk of {} bytes is not a whole number of 16-bit samples", path, size);
      VQDDP_CHECK(size <= left, "{}: the data chunk declares {} bytes but only {} remain: file truncated", path, size,
                  left);
      size_t count = size / 2;
      out.samples.resize(count);
      for (size_t i = 0; i < count; ++i)
        out.samples[i] = static_cast<float>(static_cast<int16_t>(le16(b + body + 2 * i))) / 32768.f;
      return out;
    }
    VQDDP_CHECK(size <= left, "{}: '{}' chunk at offset {} declares {} bytes but only {} remain: file truncated", path,
                id, pos, size, left);
    if (id == "fmt ") {
      out.sample_rate = parse_fmt(path, b + body, size);
      have_fmt = true;
    }
    pos = body + size + (size & 1);
  }
}

}  // namespace vqddp
