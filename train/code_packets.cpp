#include "train/code_packets.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "engine/core/error.h"
#include "engine/core/file_io.h"
#include "train/codes_file.h"

namespace vqddp {

namespace {

constexpr unsigned char kSync = 'V';
constexpr int64_t kHeader = 6, kChecksum = 4;
constexpr int64_t kStartFixed = 1 + 4 + 4 + 1 + 4 + 1;  // the start payload before its sizes
constexpr int64_t kMaxLayers = 64;

void put(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

// Codes packets are checked from the codec's fingerprint on: a packet of
// another codec (or of this stream's bytes shifted) fails.
uint32_t checksum(const std::string& bytes, size_t at, size_t n, char type, uint32_t fingerprint) {
  uint32_t crc = 0;
  if (type != 'S') {
    unsigned char f[4];
    for (int i = 0; i < 4; ++i) f[i] = static_cast<unsigned char>((fingerprint >> (8 * i)) & 0xff);
    crc = crc32c(f, 4);
  }
  return crc32c(bytes.data() + at, n, crc);
}

void seal(std::string& packet, uint32_t fingerprint) {
  put(packet, checksum(packet, 0, packet.size(), packet[1], fingerprint), 4);
}

}  // namespace

std::string start_packet(const StreamStart& s) {
  VQDDP_CHECK(!s.codebook_sizes.empty() && static_cast<int64_t>(s.codebook_sizes.size()) <= kMaxLayers &&
                  s.frames_per_packet >= 1 && s.frames_per_packet <= kMaxPacketFrames && s.sample_rate > 0 &&
                  s.sample_rate <= UINT32_MAX && s.hop > 0 && s.hop <= kMaxHop &&
                  std::all_of(s.codebook_sizes.begin(), s.codebook_sizes.end(),
                              [](int64_t k) { return k >= 1 && k <= UINT32_MAX; }),
              "a stream of {} layers, {} frames a packet, {} Hz, hop {}: not one packets can carry",
              s.codebook_sizes.size(), s.frames_per_packet, s.sample_rate, s.hop);
  std::string p;
  put(p, kSync, 1);
  put(p, 'S', 1);
  put(p, 0, 1);
  put(p, 0, 1);
  put(p, 0, 2);
  put(p, kPacketVersion, 1);
  put(p, static_cast<uint64_t>(s.sample_rate), 4);
  put(p, static_cast<uint64_t>(s.hop), 4);
  put(p, static_cast<uint64_t>(s.frames_per_packet), 1);
  put(p, s.fingerprint, 4);
  put(p, s.codebook_sizes.size(), 1);
  for (int64_t k : s.codebook_sizes) put(p, static_cast<uint64_t>(k), 4);
  seal(p, 0);
  return p;
}

std::string codes_packet(uint16_t sequence, const int64_t* codes, int64_t frames, const std::vector<int64_t>& sizes,
                         uint32_t fingerprint, bool last, int64_t kept) {
  const int64_t layers = static_cast<int64_t>(sizes.size());
  VQDDP_CHECK(frames >= 0 && frames <= kMaxPacketFrames && layers >= 1 && layers <= kMaxLayers && kept >= 0 &&
                  kept <= kMaxHop,
              "a codes packet of {} frames of {} layers, {} samples kept: at most {} frames of at most {} layers, "
              "at most {} samples", frames, layers, kept, kMaxPacketFrames, kMaxLayers, kMaxHop);
  for (int64_t i = 0; i < frames * layers; ++i)
    VQDDP_CHECK(codes[i] >= 0 && codes[i] < sizes[i % layers], "a codes packet: code {} of layer {} is outside its "
                "codebook of {}", codes[i], i % layers, sizes[i % layers]);
  std::string p;
  put(p, kSync, 1);
  put(p, last ? 'L' : 'C', 1);
  put(p, static_cast<uint64_t>(layers), 1);
  put(p, static_cast<uint64_t>(frames), 1);
  put(p, sequence, 2);
  if (last) put(p, static_cast<uint64_t>(kept), 2);
  p += pack_codes(codes, frames, sizes);
  seal(p, fingerprint);
  return p;
}

PacketReader::PacketReader(uint32_t fingerprint, std::vector<int64_t> codebook_sizes)
    : fingerprint_(fingerprint), sizes_(std::move(codebook_sizes)) {}

void PacketReader::feed(const char* data, size_t n) {
  // What has been read goes before the buffer grows: it holds at most a
  // packet and the bytes that came with it.
  if (at_ > 0 && at_ >= buf_.size() / 2) {
    buf_.erase(0, at_);
    at_ = 0;
  }
  buf_.append(data, n);
}

int64_t PacketReader::packet_size(size_t at) const {
  const auto* p = reinterpret_cast<const unsigned char*>(buf_.data()) + at;
  const int64_t have = static_cast<int64_t>(buf_.size() - at);
  if (have < kHeader) return -1;
  if (p[0] != kSync) return 0;
  const int64_t layers = p[2], frames = p[3];
  switch (p[1]) {
    case 'S': {
      if (layers != 0 || frames != 0) return 0;
      if (have < kHeader + kStartFixed) return -1;
      const int64_t l = p[kHeader + kStartFixed - 1];
      if (l < 1 || l > kMaxLayers) return 0;
      return kHeader + kStartFixed + 4 * l + kChecksum;
    }
    case 'C':
    case 'L': {
      if (layers < 1 || layers > static_cast<int64_t>(sizes_.size())) return 0;
      const std::vector<int64_t> sizes(sizes_.begin(), sizes_.begin() + layers);
      return kHeader + (p[1] == 'L' ? 2 : 0) + packed_codes_bytes(frames, sizes) + kChecksum;
    }
    default:
      return 0;
  }
}

bool PacketReader::parse(size_t at, int64_t size, Packet& p) const {
  const auto* b = reinterpret_cast<const unsigned char*>(buf_.data()) + at;
  const int64_t body = size - kChecksum;
  if (checksum(buf_, at, static_cast<size_t>(body), static_cast<char>(b[1]), fingerprint_) != get(b + body, 4))
    return false;
  p = Packet{};
  p.type = static_cast<char>(b[1]);
  p.sequence = static_cast<uint16_t>(get(b + 4, 2));
  if (p.type == 'S') {
    const unsigned char* s = b + kHeader;
    if (s[0] != kPacketVersion) return false;
    p.start.sample_rate = static_cast<int64_t>(get(s + 1, 4));
    p.start.hop = static_cast<int64_t>(get(s + 5, 4));
    p.start.frames_per_packet = s[9];
    p.start.fingerprint = static_cast<uint32_t>(get(s + 10, 4));
    // The start packet's checksum is its own: what it says is checked.
    if (p.start.sample_rate == 0 || p.start.hop == 0 || p.start.hop > kMaxHop || p.start.frames_per_packet == 0)
      return false;
    for (int64_t l = 0; l < s[14]; ++l) p.start.codebook_sizes.push_back(static_cast<int64_t>(get(s + 15 + 4 * l, 4)));
    return true;
  }
  p.layers = b[2];
  p.frames = b[3];
  const unsigned char* codes = b + kHeader;
  if (p.type == 'L') {
    p.kept = static_cast<int64_t>(get(codes, 2));
    codes += 2;
  }
  const std::vector<int64_t> sizes(sizes_.begin(), sizes_.begin() + p.layers);
  if (!unpack_codes(codes, p.frames, sizes, p.codes)) return false;
  for (size_t i = 0; i < p.codes.size(); ++i)
    if (p.codes[i] >= sizes[i % sizes.size()]) return false;
  return true;
}

bool PacketReader::whole_packet_after(size_t from) const {
  Packet scratch;
  for (size_t at = from; at < buf_.size(); ++at) {
    if (static_cast<unsigned char>(buf_[at]) != kSync) continue;
    const int64_t size = packet_size(at);
    if (size > 0 && static_cast<int64_t>(buf_.size() - at) >= size && parse(at, size, scratch)) return true;
  }
  return false;
}

bool PacketReader::next(Packet& p) {
  while (at_ < buf_.size()) {
    const int64_t size = packet_size(at_);
    const bool whole = size > 0 && static_cast<int64_t>(buf_.size() - at_) >= size;
    // More to come, unless a whole packet with a good checksum is already
    // behind this start: a damaged header claiming a long packet must not
    // hold back the packets of a live link that came after it.
    if (!whole && size != 0 && !ended_ && !whole_packet_after(at_ + 1)) return false;
    if (whole && parse(at_, size, p)) {
      p.damaged_before = damaged_;
      p.damaged_at = damaged_at_;
      p.offset = consumed_;
      damaged_ = 0;
      at_ += static_cast<size_t>(size);
      consumed_ += size;
      return true;
    }
    // Not a packet here (or, at the end, one cut short): one byte is
    // skipped, and the search goes on from the next (a packet may start
    // inside a damaged one).
    if (damaged_ == 0) damaged_at_ = consumed_;
    ++damaged_;
    ++at_;
    ++consumed_;
  }
  return false;
}

}  // namespace vqddp
