// `vqddp encode --stream` and `decode --stream`: a causal codec as a live
// link. Audio in as it arrives, packets of codes out as frames complete
// (train/code_packets.h); packets in, 16-bit PCM out as they arrive:
//
//   arecord -r 8000 -f S16_LE -c 1 | vqddp encode --stream CK | vqddp decode --stream CK | aplay -r 8000 -f S16_LE
//
// The codes are the bits of coding the whole recording at once
// (train/codec_stream.h), and so are the samples of an undamaged stream.
// A packet lost or damaged on the way is named on the log, the packets
// after it decode, and the frames it held are concealed: each repeats the
// last frame's codes, so the decoder's state goes on from sound, not from
// a jump (silence before any frame arrived). A gap of more than
// kMaxConcealSeconds is concealed for that long, the rest left out.
//
// Reads use read(2) as bytes arrive, writes write(2) at once: a pipe's
// data is never held back in a buffer. An output closed by its reader
// (EPIPE) ends the command cleanly, as does the end of the input.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "train/codec.h"

namespace vqddp {

inline constexpr double kMaxConcealSeconds = 2.0;

struct StreamInput {
  std::string name;  // for messages: a path, or "standard input"
  int fd = -1;       // raw 16-bit little-endian mono PCM from this descriptor; -1: `name` is an audio file
  int64_t rate = 0;  // raw PCM's rate as the user stated it (0: the codec's)
};

struct StreamEncodeOptions {
  int layers = 0;                 // 0: every layer
  int64_t frames_per_packet = 0;  // 0: the frames of 20 ms (at least 1)
};

struct StreamReport {
  int64_t samples = 0;   // audio samples read (encode) or written (decode)
  int64_t frames = 0;    // frames of codes coded or decoded (decode: concealed ones included)
  int64_t packets = 0;   // written, or read whole
  int64_t bytes = 0;     // of packets written or read
  int layers = 0;
  double seconds = 0;    // compute: the codec's streams, not the waiting for input
  bool output_closed = false;  // the output's reader went away first
  bool stray_byte = false;     // encode: raw input ended inside a sample (its odd byte left out)
  // decode: what was wrong with the stream (each also told to the log)
  int64_t lost_packets = 0, concealed_frames = 0, damaged_bytes = 0;
  bool damaged = false;
};

using StreamLog = std::function<void(const std::string&)>;

// Audio -> packets on `out_fd`. Refused, naming it: a codec that is not
// causal, an input at another sample rate, --layers outside the codec's.
StreamReport encode_packet_stream(const Codec& codec, const StreamInput& input, int out_fd,
                                  const StreamEncodeOptions& options);

// Packets from `in_fd` -> samples on `out_fd` (16-bit, or 32-bit float
// with `float_out`, little-endian). Refused, naming it: a codec that is
// not causal, a stream whose start packet names another codec (its
// fingerprint), rate, hop or codebooks; input that holds no packet of this
// codec at all. Damage is told to `log` and counted in the report.
StreamReport decode_packet_stream(const Codec& codec, int in_fd, int out_fd, bool float_out, const StreamLog& log);

}  // namespace vqddp
