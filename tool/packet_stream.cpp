#include "tool/packet_stream.h"

#include <fmt/format.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "data/audio.h"
#include "engine/core/error.h"
#include "engine/ops.h"
#include "train/code_packets.h"

namespace vqddp {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Up to `n` bytes as they arrive (0: the end of the input).
size_t read_some(int fd, char* buf, size_t n, const std::string& name) {
  for (;;) {
    const ssize_t got = ::read(fd, buf, n);
    if (got >= 0) return static_cast<size_t>(got);
    if (errno == EAGAIN || errno == EWOULDBLOCK) {  // a non-blocking descriptor: wait for bytes
      pollfd w{fd, POLLIN, 0};
      ::poll(&w, 1, -1);
      continue;
    }
    VQDDP_CHECK(errno == EINTR, "reading {}: {}", name, std::strerror(errno));
  }
}

// All `n` bytes, at once; false when the reader has gone (EPIPE: the
// caller ends cleanly). SIGPIPE must be ignored (the CLI does) for EPIPE
// to come back here rather than end the process.
bool write_all(int fd, const char* data, size_t n, const char* what) {
  while (n > 0) {
    const ssize_t wrote = ::write(fd, data, n);
    if (wrote < 0) {
      if (errno == EINTR) continue;
      if (errno == EPIPE) return false;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {  // a non-blocking descriptor: wait for room
        pollfd w{fd, POLLOUT, 0};
        ::poll(&w, 1, -1);
        continue;
      }
      throw Error(fmt::format("{}: writing standard output: {}", what, std::strerror(errno)));
    }
    data += wrote;
    n -= static_cast<size_t>(wrote);
  }
  return true;
}

std::vector<int64_t> first_sizes(const Codec& codec, int layers) {
  return {codec.layer_sizes().begin(), codec.layer_sizes().begin() + layers};
}

// Audio as it arrives: raw PCM from a descriptor, or an audio file a
// block at a time.
class AudioSource {
 public:
  AudioSource(const StreamInput& in, int codec_rate) : in_(in) {
    const char* fix = "; code audio at the codec's rate (vqddp convert --rate {} makes a copy at it, arecord -r {} "
                      "records at it)";
    if (in.fd < 0) {
      try {
        file_ = std::make_unique<AudioReader>(in.name);
      } catch (const Error& e) {
        throw Error(fmt::format("encode --stream: {} (raw 16-bit PCM: --raw, or on standard input)", e.what()));
      }
      VQDDP_CHECK(file_->file_rate() == codec_rate, "encode --stream: {} is {} Hz audio; the codec codes {} Hz{}",
                  in.name, file_->file_rate(), codec_rate, fmt::format(fmt::runtime(fix), codec_rate, codec_rate));
    } else {
      VQDDP_CHECK(in.rate == 0 || in.rate == codec_rate, "encode --stream: {}: --rate {} Hz; the codec codes {} Hz{}",
                  in.name, in.rate, codec_rate, fmt::format(fmt::runtime(fix), codec_rate, codec_rate));
    }
  }

  // The next samples (empty: the end).
  const std::vector<float>& next() {
    out_.clear();
    if (file_) {
      file_->read(kBlock, out_);
      return out_;
    }
    // A raw stream may stop between a sample's two bytes: the odd byte
    // waits for its partner.
    while (out_.empty()) {
      const size_t got = read_some(in_.fd, bytes_.data() + carry_, bytes_.size() - carry_, in_.name);
      if (got == 0) {
        stray_byte_ = carry_ > 0;  // the stream still ends whole; the caller says so
        carry_ = 0;
        return out_;
      }
      const size_t have = carry_ + got, whole = have / 2;
      for (size_t i = 0; i < whole; ++i) {
        const auto lo = static_cast<uint8_t>(bytes_[2 * i]), hi = static_cast<uint8_t>(bytes_[2 * i + 1]);
        out_.push_back(from_pcm16(static_cast<int16_t>(static_cast<uint16_t>(lo | (hi << 8)))));
      }
      carry_ = have % 2;
      if (carry_) bytes_[0] = bytes_[have - 1];
    }
    return out_;
  }
  // Raw input ended inside a sample: its odd last byte was left out.
  bool stray_byte() const { return stray_byte_; }

 private:
  static constexpr size_t kBlock = 8192;
  StreamInput in_;
  std::unique_ptr<AudioReader> file_;
  std::vector<char> bytes_ = std::vector<char>(2 * kBlock);
  size_t carry_ = 0;
  bool stray_byte_ = false;
  std::vector<float> out_;
};

}  // namespace

StreamReport encode_packet_stream(const Codec& codec, const StreamInput& input, int out_fd,
                                  const StreamEncodeOptions& options) {
  EncoderStream enc = codec.encoder_stream("encode --stream");
  const int q = static_cast<int>(codec.layer_sizes().size());
  const int layers = options.layers > 0 ? options.layers : q;
  codec.check_layers(layers, "encode --stream");
  const int64_t hop = codec.hop();
  const int64_t per_packet =
      options.frames_per_packet > 0 ? options.frames_per_packet
                                    : std::clamp<int64_t>(codec.sample_rate() / 50 / hop, 1, kMaxPacketFrames);
  VQDDP_CHECK(per_packet <= kMaxPacketFrames, "encode --stream: {} frames a packet: at most {}", per_packet,
              kMaxPacketFrames);
  AudioSource source(input, codec.sample_rate());
  StreamReport r;
  r.layers = layers;
  const std::vector<int64_t> sizes = first_sizes(codec, layers);
  const uint32_t fingerprint = codec.fingerprint_value();
  uint16_t sequence = 0;
  auto send = [&](const std::string& packet) {
    if (r.output_closed) return;
    r.output_closed = !write_all(out_fd, packet.data(), packet.size(), "encode --stream");
    if (r.output_closed) return;
    r.bytes += static_cast<int64_t>(packet.size());
    ++r.packets;
    ++sequence;
  };
  send(start_packet({codec.sample_rate(), hop, per_packet, fingerprint, sizes}));

  std::vector<int64_t> pending;  // codes of frames not yet sent, frames x layers
  auto take = [&](const Tensor& codes) {
    const int64_t* p = codes.data<int64_t>();
    for (int64_t f = 0; f < codes.size(0); ++f) pending.insert(pending.end(), p + f * q, p + f * q + layers);
    r.frames += codes.size(0);
  };
  auto pending_frames = [&] { return static_cast<int64_t>(pending.size()) / layers; };
  while (!r.output_closed) {
    const std::vector<float>& x = source.next();
    if (x.empty()) break;
    const auto t0 = Clock::now();
    take(enc.push(x.data(), static_cast<int64_t>(x.size())));
    r.seconds += seconds_since(t0);
    r.samples += static_cast<int64_t>(x.size());
    int64_t sent = 0;
    for (; pending_frames() - sent >= per_packet && !r.output_closed; sent += per_packet)
      send(codes_packet(sequence, pending.data() + sent * layers, per_packet, sizes, fingerprint));
    pending.erase(pending.begin(), pending.begin() + sent * layers);
  }
  r.stray_byte = source.stray_byte();
  if (r.output_closed) return r;
  // The end: the partial frame, zero-padded, and the frames still held,
  // in the last packet, which says how much of its last frame is sound.
  const auto t0 = Clock::now();
  take(enc.flush());
  r.seconds += seconds_since(t0);
  const int64_t partial = r.samples % hop;
  const int64_t kept = pending.empty() ? 0 : partial > 0 ? partial : hop;
  send(codes_packet(sequence, pending.data(), pending_frames(), sizes, fingerprint, true, kept));
  return r;
}

namespace {

// Packets up to this far behind the one due are taken as late or repeated
// (left out); a packet further from it starts a loss.
constexpr int kLateWindow = 64;

// The decoding side of one stream: what its packets said, what was
// decoded, and the last frame's codes for concealment.
class StreamDecoder {
 public:
  StreamDecoder(const Codec& codec, int out_fd, bool float_out, const StreamLog& log, StreamReport& r)
      : codec_(codec), dec_(codec.decoder_stream("decode --stream")), out_fd_(out_fd), float_out_(float_out),
        log_(log), r_(r) {}

  void packet(const Packet& p) {
    if (p.damaged_before > 0)
      damage(fmt::format("{} damaged byte{} at stream offset {} skipped (no packet of this codec in them)",
                         p.damaged_before, p.damaged_before == 1 ? "" : "s", p.damaged_at));
    r_.damaged_bytes += p.damaged_before;
    ++r_.packets;
    if (p.type == 'S') return start(p);
    if (!started_ || ended_) {
      // No start packet came for this stream (lost, or the stream joined
      // late): it decodes from here, from silence.
      damage(fmt::format("{}the stream's start packet is missing: decoding from packet {}",
                         ended_ ? "a packet after the last stream's last packet: " : "", p.sequence));
      if (ended_) {
        flush();
        dec_.reset();
        last_.clear();
      } else {
        per_packet_ = std::max<int64_t>(p.frames, 1);
      }
      started_ = true;
      ended_ = false;
      expected_ = p.sequence;
    }
    // Late or twice: a packet a little behind the one due. Any other jump
    // is a loss (an outage longer than the concealment is cut to it).
    const uint16_t gap = static_cast<uint16_t>(p.sequence - expected_);
    if (gap >= 0x10000 - kLateWindow) {
      damage(fmt::format("packet {} came late or twice (packet {} was due): left out", p.sequence, expected_));
      return;
    }
    if (gap > 0) conceal(gap);
    expected_ = static_cast<uint16_t>(p.sequence + 1);
    if (p.type == 'L' && p.frames > 0 && (p.kept < 1 || p.kept > codec_.hop())) {
      damage(fmt::format("the last packet ({}) says {} samples of its last frame are sound, of {}: taken as all",
                         p.sequence, p.kept, codec_.hop()));
    }
    decode(p.codes, p.frames, p.layers, p.type == 'L' && p.kept >= 1 && p.kept <= codec_.hop() ? p.kept : -1);
    if (p.type == 'L') ended_ = true;
  }

  void end(int64_t damaged_left, int64_t at) {
    if (damaged_left > 0)
      damage(fmt::format("{} damaged byte{} at the end of the stream (offset {}) skipped", damaged_left,
                         damaged_left == 1 ? "" : "s", at));
    r_.damaged_bytes += damaged_left;
    if (started_ && !ended_ && !r_.output_closed)
      damage(fmt::format("the stream ended without its last packet (cut short after packet {}, {:.3f} s)",
                         static_cast<uint16_t>(expected_ - 1), seconds_out()));
  }

  bool closed() const { return r_.output_closed; }

 private:
  void damage(const std::string& what) {
    r_.damaged = true;
    log_(what);
  }

  // Where the stream stands: the frames decoded or waiting to be.
  double seconds_out() const {
    return static_cast<double>((r_.frames + pending_frames_) * codec_.hop()) / codec_.sample_rate();
  }

  void start(const Packet& p) {
    flush();  // the last stream's frames, before its state goes
    const StreamStart& s = p.start;
    const std::vector<int64_t>& ours = codec_.layer_sizes();
    VQDDP_CHECK(s.fingerprint == codec_.fingerprint_value(), "decode --stream: the stream was coded by codec {:08x} (its "
                "start packet's fingerprint); {} is codec {}: decode with the checkpoint that encoded it",
                s.fingerprint, codec_.path(), codec_.fingerprint());
    VQDDP_CHECK(s.sample_rate == codec_.sample_rate() && s.hop == codec_.hop(), "decode --stream: the stream is {} "
                "Hz audio in frames of {} samples; {} codes {} Hz in frames of {}", s.sample_rate, s.hop,
                codec_.path(), codec_.sample_rate(), codec_.hop());
    VQDDP_CHECK(s.codebook_sizes.size() <= ours.size() &&
                    std::equal(s.codebook_sizes.begin(), s.codebook_sizes.end(), ours.begin()),
                "decode --stream: the stream's {} layers have codebooks of {}; {} has {} layers of {}",
                s.codebook_sizes.size(), fmt::join(s.codebook_sizes, ", "), codec_.path(), ours.size(),
                fmt::join(ours, ", "));
    if (started_ && !ended_)
      damage(fmt::format("a new stream starts at stream offset {} before the last one's last packet: that one was cut "
                         "short",
                         p.offset));
    if (started_) dec_.reset();  // a new stream (streams joined end to end) starts from silence
    started_ = true;
    ended_ = false;
    per_packet_ = s.frames_per_packet;
    expected_ = static_cast<uint16_t>(p.sequence + 1);
    last_.clear();
  }

  // `packets` lost: their frames (per_packet_ each, as every packet but
  // the last holds) as repeats of the last frame's codes.
  void conceal(uint16_t packets) {
    const int64_t most = static_cast<int64_t>(kMaxConcealSeconds * codec_.sample_rate()) / codec_.hop();
    const int64_t frames = std::min<int64_t>(packets * per_packet_, most);
    r_.lost_packets += packets;
    damage(fmt::format("{} packet{} lost before packet {} ({} frames, {:.3f} s at {:.3f} s): {}", packets,
                       packets == 1 ? "" : "s", static_cast<uint16_t>(expected_ + packets), packets * per_packet_,
                       static_cast<double>(packets * per_packet_ * codec_.hop()) / codec_.sample_rate(), seconds_out(),
                       frames < packets * per_packet_
                           ? fmt::format("the first {:.1f} s concealed, the rest left out", kMaxConcealSeconds)
                           : std::string(last_.empty() ? "concealed with silence"
                                                       : "concealed by repeating the last frame's codes")));
    r_.concealed_frames += frames;
    if (last_.empty()) {
      write(std::vector<float>(static_cast<size_t>(frames * codec_.hop()), 0.f));
      r_.frames += frames;
      return;
    }
    const int64_t layers = static_cast<int64_t>(last_.size());
    std::vector<int64_t> codes;
    for (int64_t f = 0; f < frames; ++f) codes.insert(codes.end(), last_.begin(), last_.end());
    decode(codes, frames, layers, -1);
  }

  // A push's frames at most (1.28 s of the causal main job): its
  // activations stay in the caches. 10 minutes of packets read 64 KiB
  // (~14,000 frames) at a time decoded in 4.05 s pushed whole, in 1.33 s
  // 256 frames a push (one core of the Xeon).
  static constexpr int64_t kMostFrames = 256;

  // `frames` frames of codes; `kept` >= 1: the last frame is cut to it.
  // Frames wait until flush() (after each read, and before anything else
  // is written), so the packets that came in one read decode in one push:
  // a live link reads a packet at a time, a file many.
  void decode(const std::vector<int64_t>& codes, int64_t frames, int64_t layers, int64_t kept) {
    if (frames == 0 || r_.output_closed) return;
    if (pending_frames_ > 0 && layers != pending_layers_) flush();
    pending_layers_ = layers;
    for (int64_t at = 0; at < frames;) {
      const int64_t take = std::min(frames - at, kMostFrames - pending_frames_);
      pending_.insert(pending_.end(), codes.begin() + at * layers, codes.begin() + (at + take) * layers);
      pending_frames_ += take;
      at += take;
      if (pending_frames_ == kMostFrames && at < frames) flush();
    }
    last_.assign(codes.end() - layers, codes.end());
    if (kept >= 1 || pending_frames_ >= kMostFrames) flush(kept);
  }

 public:
  void flush(int64_t kept = -1) {
    if (pending_frames_ == 0 || r_.output_closed) return;
    const auto t0 = Clock::now();
    std::vector<float> y = dec_.push(from_vector(pending_, {pending_frames_, pending_layers_}));
    r_.seconds += seconds_since(t0);
    r_.frames += pending_frames_;
    pending_.clear();
    pending_frames_ = 0;
    if (kept >= 1) y.resize(y.size() - static_cast<size_t>(codec_.hop() - kept));
    write(y);
  }

 private:
  void write(const std::vector<float>& y) {
    if (r_.output_closed || y.empty()) return;
    flush();
    bytes_.clear();
    if (float_out_) {
      bytes_.resize(y.size() * 4);
      std::memcpy(bytes_.data(), y.data(), bytes_.size());  // little-endian hosts (engine/core)
    } else {
      for (float x : y) {
        const auto v = static_cast<uint16_t>(to_pcm16(x));
        bytes_.push_back(static_cast<char>(v & 0xff));
        bytes_.push_back(static_cast<char>(v >> 8));
      }
    }
    r_.output_closed = !write_all(out_fd_, bytes_.data(), bytes_.size(), "decode --stream");
    if (!r_.output_closed) r_.samples += static_cast<int64_t>(y.size());
  }

  const Codec& codec_;
  DecoderStream dec_;
  int out_fd_;
  bool float_out_;
  const StreamLog& log_;
  StreamReport& r_;
  bool started_ = false, ended_ = false;
  int64_t per_packet_ = 1;
  uint16_t expected_ = 0;
  std::vector<int64_t> last_;  // the last frame's codes
  std::vector<int64_t> pending_;  // frames to decode, pending_frames_ x pending_layers_
  int64_t pending_frames_ = 0, pending_layers_ = 0;
  std::vector<char> bytes_;
};

}  // namespace

StreamReport decode_packet_stream(const Codec& codec, int in_fd, int out_fd, bool float_out, const StreamLog& log) {
  StreamReport r;
  StreamDecoder d(codec, out_fd, float_out, log, r);
  PacketReader reader(codec.fingerprint_value(), codec.layer_sizes());
  std::vector<char> buf(1 << 16);
  Packet p;
  int64_t read_bytes = 0;
  for (bool more = true; more && !d.closed();) {
    const size_t got = read_some(in_fd, buf.data(), buf.size(), "the packets' input");
    read_bytes += static_cast<int64_t>(got);
    if (got == 0) {
      reader.end();
      more = false;
    } else {
      reader.feed(buf.data(), got);
    }
    while (!d.closed() && reader.next(p)) d.packet(p);
    d.flush();
  }
  r.bytes = read_bytes;
  if (d.closed()) return r;
  VQDDP_CHECK(r.packets > 0 || read_bytes == 0, "decode --stream: no packet of {}'s codec (fingerprint {}) in the {} "
              "bytes of standard input: a stream of another codec, or not a code stream", codec.path(),
              codec.fingerprint(), read_bytes);
  d.end(reader.damaged_left(), reader.damaged_left_at());
  return r;
}

}  // namespace vqddp
