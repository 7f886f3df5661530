// Data readers: WAV and IDX files built byte by byte here round-trip exact
// values, and each refused or malformed file is named in its error. No test
// depends on the data packages the readers are meant for.
#include <doctest/doctest.h>

#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "engine/file_io.h"
#include "engine/error.h"
#include "tests/engine/tmpdir.h"
#include "data/idx.h"
#include "data/dataset.h"
#include "data/wav.h"

using namespace vqddp;
using vqddp::test::TempDir;

namespace {

std::string le16(uint16_t v) { return {static_cast<char>(v & 0xFF), static_cast<char>(v >> 8)}; }
std::string le32(uint32_t v) { return le16(static_cast<uint16_t>(v & 0xFFFF)) + le16(static_cast<uint16_t>(v >> 16)); }
std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16 & 0xFF), static_cast<char>(v >> 8 & 0xFF),
          static_cast<char>(v & 0xFF)};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// One RIFF chunk: id, little-endian size, body, pad byte when the size is odd.
std::string chunk(const std::string& id, const std::string& body) {
  return id + le32(static_cast<uint32_t>(body.size())) + body + (body.size() % 2 ? std::string(1, '\0') : "");
}

std::string riff_wave(const std::string& chunks) {
  return "RIFF" + le32(static_cast<uint32_t>(4 + chunks.size())) + "WAVE" + chunks;
}

std::string fmt_body(uint16_t tag, uint16_t channels, uint32_t rate, uint16_t bits) {
  uint16_t align = static_cast<uint16_t>(channels * bits / 8);
  return le16(tag) + le16(channels) + le32(rate) + le32(rate * align) + le16(align) + le16(bits);
}

// WAVE_FORMAT_EXTENSIBLE: cbSize 22, valid bits, channel mask, subformat GUID.
std::string extensible_fmt_body(uint16_t subformat) {
  return fmt_body(0xFFFE, 1, 16000, 16) + le16(22) + le16(16) + le32(4) + le16(subformat) +
         std::string("\x00\x00\x00\x00\x10\x00\x80\x00\x00\xAA\x00\x38\x9B\x71", 14);
}

std::string pcm16(const std::vector<int16_t>& samples) {
  std::string s;
  for (int16_t v : samples) s += le16(static_cast<uint16_t>(v));
  return s;
}

std::string idx_header(unsigned char type, const std::vector<uint32_t>& shape) {
  std::string h{'\0', '\0', static_cast<char>(type), static_cast<char>(shape.size())};
  for (uint32_t d : shape) h += be32(d);
  return h;
}

void write_gzip(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

}  // namespace

TEST_CASE("16-bit mono WAV round-trips exact sample values and its rate past a LIST chunk") {
  TempDir dir;
  std::string p = dir.file("a.wav");
  // The odd-sized LIST chunk checks that the pad byte after it is skipped.
  write_bytes(p, riff_wave(chunk("fmt ", fmt_body(1, 1, 22050, 16)) + chunk("LIST", "INFOx") +
                           chunk("data", pcm16({-32768, -16384, 0, 1, 16384, 32767}))));
  WavAudio w = read_wav(p);
  CHECK(w.sample_rate == 22050);
  CHECK(w.samples == std::vector<float>{-1.f, -0.5f, 0.f, 1.f / 32768, 0.5f, 32767.f / 32768});
}

TEST_CASE("extensible WAV reads like plain PCM when its subformat is PCM") {
  TempDir dir;
  std::string p = dir.file("ext.wav");
  write_bytes(p, riff_wave(chunk("fmt ", extensible_fmt_body(1)) + chunk("data", pcm16({7, -7}))));
  WavAudio w = read_wav(p);
  CHECK(w.sample_rate == 16000);
  CHECK(w.samples == std::vector<float>{7.f / 32768, -7.f / 32768});
}

TEST_CASE("a WAV file cut short in its data chunk is refused naming the file; a streamed size reads to the end") {
  TempDir dir;
  std::string p = dir.file("cut.wav");
  std::string full = riff_wave(chunk("fmt ", fmt_body(1, 1, 8000, 16)) + chunk("data", pcm16({1, 2, 3, 4, 5, 6})));
  write_bytes(p, full.substr(0, full.size() - 5));  // 3.5 samples left of 6
  CHECK_THROWS_WITH_AS(read_wav(p), doctest::Contains((p + ": the data chunk declares 12 bytes but only 7 remain: file "
                                                           "truncated").c_str()),
                       Error);
  // 0xFFFFFFFF: a writer that streamed did not know the size; the whole samples present are the clip.
  std::string streamed = riff_wave(chunk("fmt ", fmt_body(1, 1, 8000, 16))) + "data" + le32(0xFFFFFFFF) + pcm16({1, 2, 3});
  write_bytes(p, streamed + "\x01");
  CHECK(read_wav(p).samples == std::vector<float>{1.f / 32768, 2.f / 32768, 3.f / 32768});
}

TEST_CASE("a data directory: .WAV files count, a dangling symbolic link named .wav is an error naming it") {
  TempDir dir;
  std::filesystem::create_directories(dir.file("clips"));
  std::vector<int16_t> tone(800, 100);
  write_bytes(dir.file("clips/a.wav"), riff_wave(chunk("fmt ", fmt_body(1, 1, 8000, 16)) + chunk("data", pcm16(tone))));
  write_bytes(dir.file("clips/B.WAV"), riff_wave(chunk("fmt ", fmt_body(1, 1, 8000, 16)) + chunk("data", pcm16(tone))));
  write_bytes(dir.file("clips/notes.txt"), "not audio");
  DataConfig c;
  c.sources = {{dir.file("clips"), 1.0}};
  c.holdout_every = 2;
  Dataset d = load_dataset(c);
  CHECK(d.sources[0].size(0) + d.validation.size(0) == 2 * 800 / c.frame);
  std::filesystem::create_symlink(dir.file("clips/gone.wav"), dir.file("clips/c.wav"));
  CHECK_THROWS_WITH_AS(load_dataset(c), doctest::Contains(fmt::format("data source '{}': c.wav is a symbolic link to a "
                                                                      "missing file", dir.file("clips")).c_str()),
                       Error);
}

TEST_CASE("unsupported or malformed WAV files give errors naming the file and the problem") {
  TempDir dir;
  std::string p = dir.file("bad.wav");
  const std::string fmt_ok = chunk("fmt ", fmt_body(1, 1, 8000, 16));
  const std::string data_ok = chunk("data", pcm16({1, 2}));
  auto expect = [&](const std::string& what) {
    CHECK_THROWS_WITH_AS(read_wav(p), doctest::Contains(what.c_str()), Error);
    CHECK_THROWS_WITH_AS(read_wav(p), doctest::Contains(p.c_str()), Error);
  };
  SUBCASE("missing file") {
    p = dir.file("absent.wav");
    expect("cannot open");
  }
  SUBCASE("a directory") {
    p = dir.path().string();
    expect("is a directory, not a regular file");
  }
  SUBCASE("not RIFF") {
    write_bytes(p, "RIFX" + riff_wave(fmt_ok + data_ok).substr(4));
    expect("not a RIFF/WAVE file");
  }
  SUBCASE("shorter than the RIFF header") {
    write_bytes(p, "RIFF");
    expect("not a RIFF/WAVE file");
  }
  SUBCASE("stereo") {
    write_bytes(p, riff_wave(chunk("fmt ", fmt_body(1, 2, 8000, 16)) + data_ok));
    expect("2 channels, vqddp reads mono WAV only");
  }
  SUBCASE("8-bit") {
    write_bytes(p, riff_wave(chunk("fmt ", fmt_body(1, 1, 8000, 8)) + data_ok));
    expect("8 bits per sample, vqddp reads 16-bit PCM only");
  }
  SUBCASE("float format tag 3") {
    write_bytes(p, riff_wave(chunk("fmt ", fmt_body(3, 1, 8000, 32)) + data_ok));
    expect("format tag 3 (not PCM)");
  }
  SUBCASE("extensible with a float subformat") {
    write_bytes(p, riff_wave(chunk("fmt ", extensible_fmt_body(3)) + data_ok));
    expect("subformat 3 (not PCM)");
  }
  SUBCASE("missing data chunk") {
    write_bytes(p, riff_wave(fmt_ok + chunk("LIST", "INFO")));
    expect("no data chunk");
  }
  SUBCASE("missing fmt chunk") {
    write_bytes(p, riff_wave(chunk("LIST", "INFO")));
    expect("no fmt chunk");
  }
  SUBCASE("data before fmt") {
    write_bytes(p, riff_wave(data_ok + fmt_ok));
    expect("data chunk comes before the fmt chunk");
  }
  SUBCASE("truncated header: fmt chunk cut off") {
    write_bytes(p, riff_wave(fmt_ok).substr(0, 12 + 8 + 6));
    expect("'fmt ' chunk at offset 12 declares 16 bytes but only 6 remain: file truncated");
  }
  SUBCASE("truncated header: chunk header cut off") {
    write_bytes(p, riff_wave(fmt_ok) + "da");
    expect("chunk header at offset 36 is cut off");
  }
  SUBCASE("data size not a whole number of samples") {
    write_bytes(p, riff_wave(fmt_ok + chunk("data", "abc")));
    expect("data chunk of 3 bytes is not a whole number of 16-bit samples");
  }
}

TEST_CASE("gzip and plain IDX files round-trip shape and bytes") {
  TempDir dir;
  std::string bytes;
  for (int i = 0; i < 3 * 2 * 4; ++i) bytes += static_cast<char>(i * 37 % 256);
  std::string file = idx_header(0x08, {3, 2, 4}) + bytes;
  std::vector<uint8_t> want(bytes.begin(), bytes.end());

  write_gzip(dir.file("x.idx3.gz"), file);
  IdxArray gz = read_idx(dir.file("x.idx3.gz"));
  CHECK(gz.shape == Shape{3, 2, 4});
  CHECK(gz.data == want);

  write_bytes(dir.file("x.idx3"), file);
  IdxArray plain = read_idx(dir.file("x.idx3"));
  CHECK(plain.shape == Shape{3, 2, 4});
  CHECK(plain.data == want);

  // Sizes are big-endian uint32: 70000 needs all of their low three bytes.
  write_gzip(dir.file("labels.idx1.gz"), idx_header(0x08, {70000}) + std::string(70000, '\x09'));
  IdxArray labels = read_idx(dir.file("labels.idx1.gz"));
  CHECK(labels.shape == Shape{70000});
  CHECK(labels.data == std::vector<uint8_t>(70000, 9));
}

TEST_CASE("malformed IDX files give errors naming the file and the problem") {
  TempDir dir;
  std::string p = dir.file("bad.idx.gz");
  const std::string good = idx_header(0x08, {2, 3}) + "abcdef";
  auto expect = [&](const std::string& what) {
    CHECK_THROWS_WITH_AS(read_idx(p), doctest::Contains(what.c_str()), Error);
    CHECK_THROWS_WITH_AS(read_idx(p), doctest::Contains(p.c_str()), Error);
  };
  SUBCASE("missing file") {
    p = dir.file("absent.idx.gz");
    expect("cannot open");
  }
  SUBCASE("a directory") {
    p = dir.path().string();
    expect("is a directory, not a regular file");
  }
  SUBCASE("bad magic") {
    std::string bad = good;
    bad[0] = '\x01';
    write_gzip(p, bad);
    expect("bad magic 0x01 0x00");
  }
  SUBCASE("unsupported type 0x0D") {
    write_gzip(p, idx_header(0x0D, {2}) + std::string(8, '\0'));
    expect("type 0x0d (float32), vqddp reads unsigned-byte (0x08) IDX only");
  }
  SUBCASE("truncated header") {
    write_gzip(p, good.substr(0, 6));
    expect("header is cut off in the size of dimension 0 of 2");
  }
  SUBCASE("truncated data") {
    write_gzip(p, good.substr(0, good.size() - 2));
    expect("data truncated: shape [2, 3] needs 6 bytes, the file holds 4");
  }
  SUBCASE("bytes after the data") {
    write_gzip(p, good + "g");
    expect("bytes left after the 6 bytes that shape [2, 3] needs");
  }
  SUBCASE("gzip trailer CRC does not match") {
    write_gzip(p, good);
    std::string gz = read_file(p);
    gz[gz.size() - 8] = static_cast<char>(gz[gz.size() - 8] ^ 0xFF);  // first CRC-32 byte
    write_bytes(p, gz);
    expect("corrupt gzip data: incorrect data check");
  }
  SUBCASE("gzip stream cut off") {
    std::string big = idx_header(0x08, {4096});
    for (int i = 0; i < 4096; ++i) big += static_cast<char>(i * i % 251);
    write_gzip(p, big);
    std::string gz = read_file(p);
    write_bytes(p, gz.substr(0, gz.size() / 2));
    expect("data truncated: shape [4096] needs 4096 bytes");
    expect("(its gzip stream is cut off)");
  }
}
