// `vqddp encode --stream` / `decode --stream` (tool/packet_stream.h) on a
// trained causal codec: the packets hold the codes of the whole recording
// coded at once and decode to its samples, for raw PCM arriving in writes
// of any size as for a file; a lost packet is named and concealed and the
// samples after it come back to the clean ones; what does not fit is
// refused by name; a reader that goes away ends the stream cleanly.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <thread>

#include "data/audio.h"
#include "data/dataset.h"
#include "engine/core/error.h"
#include "engine/core/file_io.h"
#include "engine/core/random.h"
#include "engine/ops.h"
#include "tests/engine/tmpdir.h"
#include "tests/train/small_run.h"
#include "tool/packet_stream.h"
#include "engine/core/output_file.h"
#include "train/code_packets.h"
#include "train/codes_file.h"
#include "train/config.h"
#include "train/trainer.h"

using namespace vqddp;
using vqddp::test::TempDir;

namespace {

constexpr const char* kStreamClip = "/usr/share/asterisk/sounds/en_US_f_Allison/agent-alreadyon.wav";

// A small causal codec (hop 8, 3 residual layers of 16 codes) trained for
// 4 steps on the asterisk prompts at 8 kHz.
struct CausalRun {
  TempDir dir;
  std::string checkpoint;
  CausalRun() {
    nlohmann::json j = {
        {"model", {{"type", "conv_codec"}, {"channels", {4, 8, 8}}, {"strides", {2, 4}}, {"latent_dim", 4},
                   {"activation", "elu"}, {"causal", true}}},
        {"quantizer", {{"type", "residual_vq"}, {"num_quantizers", 3}, {"codebook_size", 16}, {"kmeans_iters", 3}}},
        {"data", {{"type", "wav_frames"}, {"sources", {{{"path", "/usr/share/asterisk/sounds/en_US_f_Allison"}}}},
                  {"frame", 256}}},
        {"schedule", {{"batch_size", 16}, {"steps", 4}}},
        {"distributed", {{"world_size", 1}}},
        {"run", {{"dir", dir.file("run")}, {"seed", 3}}}};
    Config cfg = parse_config(j, "test");
    train(cfg, load_dataset(cfg.data), test::quiet());
    checkpoint = dir.file("run/checkpoint.safetensors");
  }
};

const Codec& trained_causal_codec() {
  static CausalRun run;
  static Codec codec(run.checkpoint);
  return codec;
}

int open_out(const std::string& path) { return ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600); }
int open_in(const std::string& path) { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC); }

std::string encode_to(const Codec& codec, StreamInput in, const std::string& path, StreamEncodeOptions o) {
  const int fd = open_out(path);
  REQUIRE(fd >= 0);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};  // closed when encode_packet_stream throws, too
  encode_packet_stream(codec, in, fd, o);
  return read_file(path);
}

// The packets' bytes decoded: the samples written, and the log's lines.
struct Decoded {
  StreamReport report;
  std::string pcm;
  std::vector<std::string> log;
};

Decoded decode_from(const Codec& codec, const std::string& packets, const TempDir& dir, bool float_out = false) {
  Decoded d;
  const std::string in = dir.file("in.vqs"), out = dir.file("out.pcm");
  const int w = open_out(in);
  REQUIRE(::write(w, packets.data(), packets.size()) == static_cast<ssize_t>(packets.size()));
  ::close(w);
  const int fi = open_in(in), fo = open_out(out);
  d.report = decode_packet_stream(codec, fi, fo, float_out, [&](const std::string& s) { d.log.push_back(s); });
  ::close(fi);
  ::close(fo);
  d.pcm = read_file(out);
  return d;
}

std::string pcm16_of(const std::vector<float>& y) {
  std::string s;
  for (float x : y) {
    const auto v = static_cast<uint16_t>(to_pcm16(x));
    s.push_back(static_cast<char>(v & 0xff));
    s.push_back(static_cast<char>(v >> 8));
  }
  return s;
}

// The codes of packets (frames x layers), in order.
std::vector<int64_t> codes_of(const Codec& codec, const std::string& packets, std::vector<size_t>* starts = nullptr) {
  PacketReader r(codec.fingerprint_value(), codec.layer_sizes());
  r.feed(packets.data(), packets.size());
  r.end();
  std::vector<int64_t> codes;
  Packet p;
  while (r.next(p)) {
    REQUIRE(p.damaged_before == 0);
    codes.insert(codes.end(), p.codes.begin(), p.codes.end());
    if (starts) starts->push_back(static_cast<size_t>(p.offset));
  }
  return codes;
}

}  // namespace

TEST_CASE("encode --stream's packets are the codes of the whole recording at once; decode --stream gives its samples") {
  const Codec& codec = trained_causal_codec();
  TempDir dir;
  const std::vector<float> x = read_audio(kStreamClip).samples;
  const int64_t n = static_cast<int64_t>(x.size()), hop = codec.hop();
  REQUIRE(n % hop != 0);  // the last frame is partial: padded, then cut back
  StreamEncodeOptions o;
  o.layers = 2;
  o.frames_per_packet = 3;
  const std::string packets = encode_to(codec, {kStreamClip, -1, 0}, dir.file("a.vqs"), o);

  // The whole recording through the library's streams in one push each.
  EncoderStream enc = codec.encoder_stream("test");
  Tensor all = concat({enc.push(x.data(), n), enc.flush()}, 0);
  const int64_t frames = all.size(0);
  CHECK(frames == (n + hop - 1) / hop);
  std::vector<int64_t> want;
  for (int64_t f = 0; f < frames; ++f)
    for (int64_t l = 0; l < 2; ++l) want.push_back(all.data<int64_t>()[f * 3 + l]);
  CHECK(codes_of(codec, packets) == want);

  DecoderStream dec = codec.decoder_stream("test");
  std::vector<float> y = dec.push(from_vector(want, {frames, 2}));
  y.resize(static_cast<size_t>(n));
  const Decoded d = decode_from(codec, packets, dir);
  CHECK(d.log.empty());
  CHECK_FALSE(d.report.damaged);
  CHECK(d.report.samples == n);
  CHECK(d.pcm == pcm16_of(y));
  const Decoded f = decode_from(codec, packets, dir, true);
  REQUIRE(f.pcm.size() == y.size() * 4);
  CHECK(std::memcmp(f.pcm.data(), y.data(), f.pcm.size()) == 0);
}

TEST_CASE("raw PCM arriving in writes of any size, down to a byte, gives the packets of the file") {
  const Codec& codec = trained_causal_codec();
  TempDir dir;
  const std::string from_file = encode_to(codec, {kStreamClip, -1, 0}, dir.file("file.vqs"), {});
  std::string pcm = pcm16_of(read_audio(kStreamClip).samples);
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  std::thread writer([&] {
    Generator g(11, 0);
    for (size_t at = 0; at < pcm.size();) {
      const size_t k = std::min<size_t>(pcm.size() - at, 1 + g.uniform_int(uint64_t{97}));
      const ssize_t w = ::write(fds[1], pcm.data() + at, k);
      if (w <= 0) break;
      at += static_cast<size_t>(w);
      // Time for the encoder to read each write on its own (else the pipe
      // fills first and is read in big even blocks).
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    ::close(fds[1]);
  });
  const std::string from_pipe = encode_to(codec, {"pipe", fds[0], 8000}, dir.file("pipe.vqs"), {});
  writer.join();
  ::close(fds[0]);
  CHECK(from_pipe == from_file);
}

TEST_CASE("a lost packet is named and concealed, the output keeps its length, and later samples are the clean ones") {
  const Codec& codec = trained_causal_codec();
  TempDir dir;
  StreamEncodeOptions o;
  o.frames_per_packet = 2;
  const std::string packets = encode_to(codec, {kStreamClip, -1, 0}, dir.file("a.vqs"), o);
  std::vector<size_t> starts;
  const std::vector<int64_t> all_codes = codes_of(codec, packets, &starts);
  const Decoded clean = decode_from(codec, packets, dir);
  // A packet in speech, not in the silence before it (where every frame's
  // codes are the same, and a repeat is the truth) left out: the first
  // from a third in whose first frame's codes differ from the frame's
  // before. Packet k holds frames 2(k - 1) and 2(k - 1) + 1.
  const size_t row = 3 * 2;  // codes a packet
  size_t k = starts.size() / 3;
  while (std::equal(all_codes.begin() + static_cast<ptrdiff_t>((k - 1) * row),
                    all_codes.begin() + static_cast<ptrdiff_t>((k - 1) * row + 3),
                    all_codes.begin() + static_cast<ptrdiff_t>((k - 1) * row - 3)))
    REQUIRE(++k < starts.size() - 1);
  const std::string lost = packets.substr(0, starts[k]) + packets.substr(starts[k + 1]);
  const Decoded d = decode_from(codec, lost, dir);
  CHECK(d.report.damaged);
  CHECK(d.report.lost_packets == 1);
  CHECK(d.report.concealed_frames == 2);
  REQUIRE(d.log.size() == 1);
  CHECK(d.log[0].find(fmt::format("1 packet lost before packet {} (2 frames", k + 1)) != std::string::npos);
  CHECK(d.log[0].find("concealed by repeating the last frame's codes") != std::string::npos);
  REQUIRE(d.pcm.size() == clean.pcm.size());
  const size_t bytes_a_frame = static_cast<size_t>(codec.hop()) * 2, gap = 2 * (k - 1) * bytes_a_frame,
               tail = clean.pcm.size() * 3 / 4;
  CHECK(d.pcm.substr(0, gap) == clean.pcm.substr(0, gap));
  CHECK(d.pcm.substr(gap, 2 * bytes_a_frame) != clean.pcm.substr(gap, 2 * bytes_a_frame));
  CHECK(d.pcm.substr(tail) == clean.pcm.substr(tail));
}

TEST_CASE("decode --stream refuses another codec's stream and noise; encode --stream another rate; both end when "
          "their reader goes") {
  const Codec& codec = trained_causal_codec();
  TempDir dir;
  const std::string packets = encode_to(codec, {kStreamClip, -1, 0}, dir.file("a.vqs"), {});
  // The start packet of a codec with another fingerprint.
  StreamStart other{8000, codec.hop(), 4, codec.fingerprint_value() ^ 4,
                    codec.layer_sizes()};
  std::string msg;
  try {
    decode_from(codec, start_packet(other) + packets.substr(start_packet(other).size()), dir);
  } catch (const Error& e) {
    msg = e.what();
  }
  CHECK(msg.find("the stream was coded by codec") != std::string::npos);
  CHECK(msg.find(codec.fingerprint()) != std::string::npos);
  CHECK_THROWS_WITH_AS(decode_from(codec, std::string(500, 'x'), dir),
                       doctest::Contains("no packet of"), Error);
  CHECK_THROWS_WITH_AS(encode_to(codec, {"standard input", 0, 16000}, dir.file("b.vqs"), {}),
                       doctest::Contains("--rate 16000 Hz; the codec codes 8000 Hz"), Error);

  std::signal(SIGPIPE, SIG_IGN);  // as the CLI does: EPIPE comes back to the writer
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  ::close(fds[0]);
  const StreamReport e = encode_packet_stream(codec, {kStreamClip, -1, 0}, fds[1], {});
  CHECK(e.output_closed);
  CHECK(e.packets == 0);
  const int fi = open_in(dir.file("a.vqs"));
  const StreamReport d = decode_packet_stream(codec, fi, fds[1], false, [](const std::string&) {});
  CHECK(d.output_closed);
  ::close(fi);
  ::close(fds[1]);
}

TEST_CASE("a causal codec's codes file holds the stream's codes and decodes to the stream's samples, in any chunks") {
  const Codec& codec = trained_causal_codec();
  TempDir dir;
  const std::string packets = encode_to(codec, {kStreamClip, -1, 0}, dir.file("a.vqs"), {});
  const Decoded streamed = decode_from(codec, packets, dir, true);
  for (int64_t chunk : {int64_t{1}, int64_t{3}, int64_t{256}}) {
    CAPTURE(chunk);
    const std::string out = dir.file(fmt::format("chunk{}", chunk));
    EncodeOptions eo;
    eo.chunk_frames = chunk;
    {
      OutputDir o(out, "encode");
      encode_audio_file(codec, kStreamClip, o, eo);
      o.keep();
    }
    // The file's last frame is padded to a whole F samples, the stream's to
    // a hop: the file holds the stream's rows, then those of the padding.
    const CodesFile c = read_codes_file(out + "/agent-alreadyon.codes", &codec.code_model());
    const std::vector<int64_t> rows = codes_of(codec, packets);
    REQUIRE(c.codes.size() >= rows.size());
    CHECK(c.codes.size() - rows.size() < static_cast<size_t>(codec.tokens() * 3));
    CHECK(std::vector<int64_t>(c.codes.begin(), c.codes.begin() + static_cast<ptrdiff_t>(rows.size())) == rows);
    DecodeOptions d;
    d.float_wav = true;
    d.chunk_frames = chunk;
    {
      OutputDir o(out, "decode");
      decode_codes_file(codec, out + "/agent-alreadyon.codes", o, d);
      o.keep();
    }
    const std::vector<float> y = read_audio(out + "/agent-alreadyon.wav").samples;
    REQUIRE(y.size() * 4 == streamed.pcm.size());
    CHECK(std::memcmp(y.data(), streamed.pcm.data(), streamed.pcm.size()) == 0);
  }
}

namespace {

// A stream built by hand from the clip's codes (all 3 layers, 2 frames a
// packet): its start packet at sequence `first`, then the codes packets
// numbered on from it, wrapping; `n` codes packets, the last an 'L'.
struct HandStream {
  std::vector<std::string> packets;  // [0]: the start packet
  std::vector<int64_t> codes;        // frames x 3
  std::string bytes(const std::vector<size_t>& leave_out = {}) const {
    std::string b;
    for (size_t i = 0; i < packets.size(); ++i)
      if (std::find(leave_out.begin(), leave_out.end(), i) == leave_out.end()) b += packets[i];
    return b;
  }
};

HandStream hand_stream(const Codec& codec, uint16_t first, int n) {
  EncoderStream enc = codec.encoder_stream("test");
  const std::vector<float> x = read_audio(kStreamClip).samples;
  Tensor all = enc.push(x.data(), static_cast<int64_t>(x.size()));
  REQUIRE(all.size(0) >= 2 * n);
  HandStream h;
  const uint32_t print = codec.fingerprint_value();
  StreamStart st{codec.sample_rate(), codec.hop(), 2, print, codec.layer_sizes()};
  std::string start = start_packet(st);
  // The start packet says sequence 0; patch it to `first` (its checksum is its own).
  start[4] = static_cast<char>(first & 0xff);
  start[5] = static_cast<char>(first >> 8);
  const uint32_t crc = crc32c(start.data(), start.size() - 4);
  for (int i = 0; i < 4; ++i) start[start.size() - 4 + static_cast<size_t>(i)] = static_cast<char>((crc >> (8 * i)) & 0xff);
  h.packets.push_back(start);
  h.codes.assign(all.data<int64_t>(), all.data<int64_t>() + 2 * n * 3);
  for (int i = 0; i < n; ++i)
    h.packets.push_back(codes_packet(static_cast<uint16_t>(first + 1 + i), h.codes.data() + 6 * i, 2,
                                     codec.layer_sizes(), print, i == n - 1, i == n - 1 ? codec.hop() : 0));
  return h;
}

std::string clean_pcm(const Codec& codec, const std::vector<int64_t>& codes) {
  DecoderStream dec = codec.decoder_stream("test");
  return pcm16_of(dec.push(from_vector(codes, {static_cast<int64_t>(codes.size()) / 3, 3})));
}

bool logged(const Decoded& d, const std::string& what) {
  for (const std::string& line : d.log)
    if (line.find(what) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("decode --stream across the sequence number's wrap, with a packet twice, without its start packet, and "
          "joined to another stream whose start was lost") {
  const Codec& codec = trained_causal_codec();
  TempDir dir;
  const HandStream h = hand_stream(codec, 65530, 12);  // codes packets 65531 .. 65535, 0 .. 6
  const std::string clean = clean_pcm(codec, h.codes);
  Decoded d = decode_from(codec, h.bytes(), dir);
  CHECK(d.log.empty());
  CHECK(d.pcm == clean);

  // Packet 65535 again after packet 0: late or twice, left out.
  std::string twice = h.bytes();
  twice.insert(twice.find(h.packets[7]), h.packets[5]);
  d = decode_from(codec, twice, dir);
  CHECK(logged(d, "packet 65535 came late or twice (packet 1 was due): left out"));
  CHECK(d.report.lost_packets == 0);
  CHECK(d.pcm == clean);

  // No start packet: decoded from the first codes packet, the same bits
  // (the start packet carries no codes).
  d = decode_from(codec, h.bytes({0}), dir);
  CHECK(logged(d, "the stream's start packet is missing: decoding from packet 65531"));
  CHECK(d.pcm == clean);

  // Two streams end to end, the second's start lost: each from silence.
  d = decode_from(codec, h.bytes() + h.bytes({0}), dir);
  CHECK(logged(d, "a packet after the last stream's last packet: the stream's start packet is missing"));
  CHECK(d.report.lost_packets == 0);
  CHECK(d.pcm == clean + clean);
}

TEST_CASE("decode --stream conceals a lost first packet with silence and a long outage for 2 s only") {
  const Codec& codec = trained_causal_codec();
  TempDir dir;
  const HandStream h = hand_stream(codec, 0, 12);
  // The first codes packet lost: no frame to repeat yet, so silence.
  Decoded d = decode_from(codec, h.bytes({1}), dir);
  CHECK(logged(d, "1 packet lost before packet 2 (2 frames, 0.002 s at 0.000 s): concealed with silence"));
  const size_t frame_bytes = static_cast<size_t>(codec.hop()) * 2;
  CHECK(d.pcm.substr(0, 2 * frame_bytes) == std::string(2 * frame_bytes, '\0'));
  CHECK(d.pcm.size() == clean_pcm(codec, h.codes).size());

  // An outage of 3000 packets (6000 frames of 1 ms): 2 s concealed.
  HandStream late = hand_stream(codec, 0, 12);
  const uint32_t print = codec.fingerprint_value();
  late.packets.back() = codes_packet(3012, late.codes.data() + 6 * 11, 2, codec.layer_sizes(), print, true, codec.hop());
  d = decode_from(codec, late.bytes(), dir);
  CHECK(logged(d, "3000 packets lost before packet 3012 (6000 frames"));
  CHECK(logged(d, "the first 2.0 s concealed, the rest left out"));
  CHECK(d.report.concealed_frames == 2 * codec.sample_rate() / codec.hop());
  CHECK(d.report.samples == (24 + 2 * codec.sample_rate() / codec.hop()) * codec.hop());
}

TEST_CASE("decode --stream's samples do not depend on how its input arrives: a byte at a time or in odd pieces") {
  const Codec& codec = trained_causal_codec();
  TempDir dir;
  const std::string packets = encode_to(codec, {kStreamClip, -1, 0}, dir.file("a.vqs"), {});
  const Decoded whole = decode_from(codec, packets, dir);
  for (uint64_t most : {uint64_t{1}, uint64_t{23}}) {
    CAPTURE(most);
    int in[2];
    REQUIRE(::pipe(in) == 0);
    std::thread writer([&] {
      Generator g(most, 0);
      for (size_t at = 0; at < packets.size();) {
        const size_t k = std::min<size_t>(packets.size() - at, 1 + g.uniform_int(most));
        const ssize_t w = ::write(in[1], packets.data() + at, k);
        if (w <= 0) break;
        at += static_cast<size_t>(w);
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      ::close(in[1]);
    });
    const std::string out = dir.file("piped.pcm");
    const int fo = open_out(out);
    const StreamReport r = decode_packet_stream(codec, in[0], fo, false, [](const std::string&) {});
    writer.join();
    ::close(in[0]);
    ::close(fo);
    CHECK_FALSE(r.damaged);
    CHECK(read_file(out) == whole.pcm);
  }
}
