// The packets of a live code stream (train/code_packets.h): what is
// written reads back the same fed a byte at a time or whole; a damaged
// byte anywhere costs its packet and no other; another codec's packets and
// bytes that are no packet are skipped and counted; a cut at the end is
// damage, and what follows a damaged header still reads.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/file_io.h"
#include "engine/core/random.h"
#include "train/code_packets.h"
#include "train/codes_file.h"

using namespace vqddp;

namespace {

// Codebooks of 16, 1000 (10 bits, not a power of two) and 256 codes.
const std::vector<int64_t> kPacketSizes = {16, 1000, 256};
constexpr uint32_t kPrint = 0x1234abcd;

std::vector<int64_t> packet_codes(int64_t frames, int64_t layers, uint64_t seed) {
  Generator g(seed, 0);
  std::vector<int64_t> c;
  for (int64_t i = 0; i < frames * layers; ++i)
    c.push_back(static_cast<int64_t>(g.uniform_int(static_cast<uint64_t>(kPacketSizes[i % layers]))));
  return c;
}

std::vector<int64_t> sizes_of(int64_t layers) { return {kPacketSizes.begin(), kPacketSizes.begin() + layers}; }

// A stream: start, `n` codes packets of 4 frames of 2 layers, the last of 3
// frames (2 samples of its last frame kept); and the codes of each.
struct PacketStream {
  std::string bytes;
  std::vector<size_t> starts;  // each packet's offset
  std::vector<std::vector<int64_t>> codes;
};

PacketStream packet_stream(int n) {
  PacketStream s;
  auto add = [&](const std::string& p) {
    s.starts.push_back(s.bytes.size());
    s.bytes += p;
  };
  add(start_packet({8000, 40, 4, kPrint, sizes_of(2)}));
  for (int i = 0; i < n; ++i) {
    const bool last = i == n - 1;
    s.codes.push_back(packet_codes(last ? 3 : 4, 2, static_cast<uint64_t>(i)));
    add(codes_packet(static_cast<uint16_t>(i + 1), s.codes.back().data(), last ? 3 : 4, sizes_of(2), kPrint, last,
                     last ? 2 : 0));
  }
  return s;
}

// Every packet the reader gives, the stream fed `step` bytes at a time.
std::vector<Packet> read_all(const std::string& bytes, size_t step, int64_t* left = nullptr) {
  PacketReader r(kPrint, kPacketSizes);
  std::vector<Packet> out;
  Packet p;
  for (size_t at = 0; at < bytes.size(); at += step) {
    r.feed(bytes.data() + at, std::min(step, bytes.size() - at));
    while (r.next(p)) out.push_back(p);
  }
  r.end();
  while (r.next(p)) out.push_back(p);
  if (left) *left = r.damaged_left();
  return out;
}

}  // namespace

TEST_CASE("code packets read back as written, fed whole or a byte at a time") {
  const PacketStream s = packet_stream(6);
  for (size_t step : {s.bytes.size(), size_t{1}, size_t{7}}) {
    CAPTURE(step);
    int64_t left = -1;
    const std::vector<Packet> got = read_all(s.bytes, step, &left);
    CHECK(left == 0);
    REQUIRE(got.size() == 7);
    CHECK(got[0].type == 'S');
    CHECK(got[0].start.sample_rate == 8000);
    CHECK(got[0].start.hop == 40);
    CHECK(got[0].start.frames_per_packet == 4);
    CHECK(got[0].start.fingerprint == kPrint);
    CHECK(got[0].start.codebook_sizes == sizes_of(2));
    for (int i = 0; i < 6; ++i) {
      const Packet& p = got[static_cast<size_t>(i + 1)];
      CHECK(p.type == (i == 5 ? 'L' : 'C'));
      CHECK(p.sequence == i + 1);
      CHECK(p.layers == 2);
      CHECK(p.codes == s.codes[static_cast<size_t>(i)]);
      CHECK(p.damaged_before == 0);
      CHECK(p.offset == static_cast<int64_t>(s.starts[static_cast<size_t>(i + 1)]));
    }
    CHECK(got[6].kept == 2);
    CHECK(got[6].frames == 3);
  }
  // Framing: 10 bytes a packet, then the codes' bits (4 frames of 4 + 10 bits: 7 bytes).
  CHECK(s.starts[2] - s.starts[1] == 10 + 7);
}

TEST_CASE("a damaged byte anywhere in a packet costs that packet and no other") {
  const PacketStream s = packet_stream(4);
  // Every byte of the second codes packet, each bit pattern that changes it.
  for (size_t at = s.starts[2]; at < s.starts[3]; ++at)
    for (int flip : {0x01, 0x80, 0xff}) {
      CAPTURE(at);
      CAPTURE(flip);
      std::string bytes = s.bytes;
      bytes[at] = static_cast<char>(bytes[at] ^ flip);
      const std::vector<Packet> got = read_all(bytes, 5);
      REQUIRE(got.size() == 4);
      CHECK(got[1].sequence == 1);
      CHECK(got[2].sequence == 3);  // 2 is gone
      CHECK(got[2].codes == s.codes[2]);
      CHECK(got[2].damaged_before == static_cast<int64_t>(s.starts[3] - s.starts[2]));
      CHECK(got[2].damaged_at == static_cast<int64_t>(s.starts[2]));
      CHECK(got[3].damaged_before == 0);
    }
}

TEST_CASE("another codec's packets, bytes that are no packet, and a cut end are skipped and counted") {
  const PacketStream s = packet_stream(3);
  // Another fingerprint: only the start packet reads (its checksum is its own);
  // it names the other codec, which the decoder refuses.
  PacketReader other(kPrint ^ 1, kPacketSizes);
  other.feed(s.bytes.data(), s.bytes.size());
  other.end();
  Packet p;
  REQUIRE(other.next(p));
  CHECK(p.type == 'S');
  CHECK_FALSE(other.next(p));
  CHECK(other.damaged_left() == static_cast<int64_t>(s.bytes.size() - s.starts[1]));

  // Noise between packets, and a stream cut inside its last packet.
  std::string bytes = s.bytes.substr(0, s.starts[2]) + std::string(13, 'V') + s.bytes.substr(s.starts[2]);
  bytes.resize(bytes.size() - 3);
  int64_t left = 0;
  const std::vector<Packet> got = read_all(bytes, 3, &left);
  REQUIRE(got.size() == 3);  // start, 1, 2: the last is cut
  CHECK(got[2].damaged_before == 13);
  CHECK(left == static_cast<int64_t>(s.bytes.size() - s.starts[3] - 3));

  // A damaged header that claims a long packet: the reader waits for its
  // bytes, and once the stream has ended reads the whole packets behind it.
  std::string claim = s.bytes.substr(0, s.starts[1]) + std::string("VC\x02\xff\x00\x00", 6) + s.bytes.substr(s.starts[1]);
  const std::vector<Packet> behind = read_all(claim, claim.size());
  REQUIRE(behind.size() == 4);
  CHECK(behind[1].damaged_before == 6);
  // ... and, on a live link, before the stream ends: the whole packets
  // behind the claim are not held back waiting for its bytes.
  PacketReader live(kPrint, kPacketSizes);
  live.feed(claim.data(), claim.size());
  int read_live = 0;
  Packet lp;
  while (live.next(lp)) ++read_live;
  CHECK(read_live == 4);

  // A start packet that says 0 frames a packet (checksum and all) is not one.
  std::string zero = start_packet({8000, 40, 4, kPrint, sizes_of(2)});
  zero[6 + 9] = 0;
  const uint32_t crc = crc32c(zero.data(), zero.size() - 4);
  for (int i = 0; i < 4; ++i) zero[zero.size() - 4 + static_cast<size_t>(i)] = static_cast<char>((crc >> (8 * i)) & 0xff);
  PacketReader r0(kPrint, kPacketSizes);
  r0.feed(zero.data(), zero.size());
  r0.end();
  CHECK_FALSE(r0.next(lp));
}

TEST_CASE("a codes packet refuses codes outside their codebooks, and a reader a packed code outside them") {
  const std::vector<int64_t> bad = {3, 1000};
  CHECK_THROWS_AS(codes_packet(1, bad.data(), 1, sizes_of(2), kPrint), Error);
  // 1000 codes in 10 bits: 1023 packs, and a packet holding it (checksum
  // and all) is not read.
  const std::vector<int64_t> wide = {3, 1023};
  std::string packet = codes_packet(1, wide.data(), 1, {16, 1024}, kPrint);
  PacketReader r(kPrint, kPacketSizes);
  r.feed(packet.data(), packet.size());
  r.end();
  Packet p;
  CHECK_FALSE(r.next(p));
  CHECK(r.damaged_left() == static_cast<int64_t>(packet.size()));
}
