// The packets of a live code stream: what `vqddp encode --stream` writes as
// frames complete and `vqddp decode --stream` reads (tool/packet_stream.h).
// A byte stream, so a pipe, a socket or a file carries it; a packet lost
// or damaged on the way is found (sequence numbers, checksums) and the
// packets after it still read (the reader finds the next packet's start).
//
// Every packet, integers little-endian:
//   sync        u8   'V'
//   type        u8   'S' start, 'C' codes, 'L' the last codes of the stream
//   layers      u8   layers of codes per frame (S: 0)
//   frames      u8   frames of codes (S: 0)
//   sequence    u16  0 for the start packet, then +1 a packet (wrapping)
//   payload
//   checksum    u32  CRC32C of every byte before it; codes packets start
//                    from the codec's fingerprint, so another codec's
//                    packets fail it
// S payload: version u8 (1), sample rate u32, hop u32 (samples a frame),
//   frames a packet u8, fingerprint u32, layers L u8, L codebook sizes u32.
// C payload: the frames' codes, frame by frame, layer by layer, each code in
//   code_bits(size) bits, least significant first, the last byte padded
//   with zero bits (train/codes_file.h pack_codes).
// L payload: kept u16 (samples of its last frame that belong to the
//   stream: the encoder padded the partial frame at the end with zeros),
//   then as C. A stream of whole frames ends kept = hop; an empty one
//   ends with 0 frames.
// Framing costs 10 bytes a packet: at 20 ms a packet, 4 kbit/s.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vqddp {

inline constexpr int kPacketVersion = 1;
inline constexpr int64_t kMaxPacketFrames = 255;
inline constexpr int64_t kMaxHop = 0xffff;  // samples a frame (the last packet's kept is a u16)

struct StreamStart {
  int64_t sample_rate = 0;
  int64_t hop = 0;                 // samples a frame of codes
  int64_t frames_per_packet = 0;   // every codes packet but the last holds this many
  uint32_t fingerprint = 0;        // the codec's (Codec::fingerprint, as a number)
  std::vector<int64_t> codebook_sizes;  // of the L layers coded
};

struct Packet {
  char type = 0;  // 'S', 'C' or 'L'
  uint16_t sequence = 0;
  StreamStart start;            // 'S'
  int64_t layers = 0, frames = 0;
  std::vector<int64_t> codes;   // 'C', 'L': frames x layers, row-major
  int64_t kept = 0;             // 'L'
  // Bytes skipped as damaged (no packet could be read from them) just
  // before this packet, and the stream offset where they began.
  int64_t damaged_before = 0, damaged_at = 0;
  int64_t offset = 0;           // the packet's first byte in the stream
};

std::string start_packet(const StreamStart& s);
// `codes` frames x sizes.size(), each inside its codebook (checked);
// `last`: an 'L' packet, `kept` its last frame's samples.
std::string codes_packet(uint16_t sequence, const int64_t* codes, int64_t frames, const std::vector<int64_t>& sizes,
                         uint32_t fingerprint, bool last = false, int64_t kept = 0);

// Packets out of a byte stream fed as it arrives. Codes packets are read
// under the decoding codec's fingerprint and codebook sizes (so they read
// without the start packet); bytes that are not a whole packet with a good
// checksum are skipped, one at a time, until one is: a damaged packet
// costs that packet, never the ones after it.
class PacketReader {
 public:
  PacketReader(uint32_t fingerprint, std::vector<int64_t> codebook_sizes);
  void feed(const char* data, size_t n);
  // The next packet, if the bytes fed hold one whole; false: feed more
  // (or end()).
  bool next(Packet& p);
  // The stream has ended: bytes that can no longer complete a packet are
  // damage, and next() reads on past them to any whole packet after.
  void end() { ended_ = true; }
  // Once next() has returned false after end(): the bytes skipped since
  // the last packet, and the offset of the first.
  int64_t damaged_left() const { return damaged_; }
  int64_t damaged_left_at() const { return damaged_at_; }
  int64_t offset() const { return consumed_; }  // bytes of the stream read so far

 private:
  // The whole size of the packet at buf_[at] from its header, or 0 where
  // the header is not one (-1: more bytes are needed to tell).
  int64_t packet_size(size_t at) const;
  bool parse(size_t at, int64_t size, Packet& p) const;
  // Whether a whole packet with a good checksum starts at or after `from`.
  bool whole_packet_after(size_t from) const;

  uint32_t fingerprint_;
  std::vector<int64_t> sizes_;
  std::string buf_;
  size_t at_ = 0;           // next unread byte of buf_
  int64_t consumed_ = 0;    // stream offset of buf_[at_]
  int64_t damaged_ = 0, damaged_at_ = 0;  // skipped since the last packet
  bool ended_ = false;
};

}  // namespace vqddp
