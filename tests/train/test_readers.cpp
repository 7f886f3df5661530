// Data readers: audio files (byte-built WAV, and every format libsndfile
// writes here) and IDX files round-trip, and each refused or malformed file
// is named in its error. No test
// depends on the data packages the readers are meant for.
#include <doctest/doctest.h>

#include <sndfile.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "engine/core/file_io.h"
#include "engine/core/error.h"
#include "tests/engine/tmpdir.h"
#include "data/idx.h"
#include "data/dataset.h"
#include "data/audio.h"
#include "data/audio_windows.h"

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

// A file written by libsndfile: `format` (SF_FORMAT_*), interleaved frames.
void write_audio(const std::string& path, int format, int rate, int channels, const std::vector<float>& frames) {
  SF_INFO info{};
  info.samplerate = rate;
  info.channels = channels;
  info.format = format;
  SNDFILE* f = sf_open(path.c_str(), SFM_WRITE, &info);
  REQUIRE_MESSAGE(f != nullptr, sf_strerror(nullptr));
  const sf_count_t n = static_cast<sf_count_t>(frames.size() / channels);
  const int sub = format & SF_FORMAT_SUBMASK;
  if (sub == SF_FORMAT_PCM_16 || sub == SF_FORMAT_PCM_24 || sub == SF_FORMAT_PCM_32 || sub == SF_FORMAT_PCM_U8) {
    // As int32 (v * 2^31): libsndfile writes float with a 0x7FFF scale but
    // reads with 1/0x8000, so only integers keep k / 32768 exact.
    std::vector<int> ints(frames.size());
    for (size_t i = 0; i < frames.size(); ++i) ints[i] = static_cast<int>(std::lround(double(frames[i]) * 2147483648.0));
    REQUIRE(sf_writef_int(f, ints.data(), n) == n);
  } else {
    REQUIRE(sf_writef_float(f, frames.data(), n) == n);
  }
  sf_close(f);
}

// A 16-bit-exact test signal: a 220 Hz tone plus steps, every value k / 32768.
std::vector<float> tone(int n, int rate) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i)
    v[i] = std::round(0.5 * std::sin(2 * M_PI * 220.0 * i / rate) * 32768.0) / 32768.f + (i % 7 == 0 ? 1.f / 32768 : 0.f);
  return v;
}

double rms_error(const std::vector<float>& a, const std::vector<float>& b) {
  double se = 0;
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) se += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(se / std::max<size_t>(n, 1));
}

}  // namespace

TEST_CASE("audio: 16-bit mono WAV built byte by byte reads exact values and its rate past a LIST chunk; extensible PCM "
          "too") {
  TempDir dir;
  std::string p = dir.file("a.wav");
  // The odd-sized LIST chunk checks that the pad byte after it is skipped.
  write_bytes(p, riff_wave(chunk("fmt ", fmt_body(1, 1, 22050, 16)) + chunk("LIST", "INFOx") +
                           chunk("data", pcm16({-32768, -16384, 0, 1, 16384, 32767}))));
  Audio a = read_audio(p);
  CHECK(a.sample_rate == 22050);
  CHECK(a.samples == std::vector<float>{-1.f, -0.5f, 0.f, 1.f / 32768, 0.5f, 32767.f / 32768});
  write_bytes(p, riff_wave(chunk("fmt ", extensible_fmt_body(1)) + chunk("data", pcm16({7, -7}))));
  a = read_audio(p);
  CHECK(a.sample_rate == 16000);
  CHECK(a.samples == std::vector<float>{7.f / 32768, -7.f / 32768});
}

TEST_CASE("audio: every format libsndfile writes here round-trips: lossless ones exactly (WAV 8/16/24/32-bit and "
          "float, FLAC, AIFF), lossy ones closely (Ogg Vorbis, Opus, MP3 where the build has it)") {
  TempDir dir;
  const std::vector<float> x = tone(4800, 48000);
  struct Case {
    const char* file;
    int format;
    double rms;  // 0: exact
  };
  const Case cases[] = {
      {"pcm16.wav", SF_FORMAT_WAV | SF_FORMAT_PCM_16, 0},   {"pcm24.wav", SF_FORMAT_WAV | SF_FORMAT_PCM_24, 0},
      {"pcm32.wav", SF_FORMAT_WAV | SF_FORMAT_PCM_32, 0},   {"float.wav", SF_FORMAT_WAV | SF_FORMAT_FLOAT, 0},
      {"pcm16.flac", SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 0}, {"pcm24.flac", SF_FORMAT_FLAC | SF_FORMAT_PCM_24, 0},
      {"pcm16.aiff", SF_FORMAT_AIFF | SF_FORMAT_PCM_16, 0}, {"u8.wav", SF_FORMAT_WAV | SF_FORMAT_PCM_U8, 0.005},
      {"vorbis.ogg", SF_FORMAT_OGG | SF_FORMAT_VORBIS, 0.05}, {"opus.opus", SF_FORMAT_OGG | SF_FORMAT_OPUS, 0.1},
      {"layer3.mp3", SF_FORMAT_MPEG | SF_FORMAT_MPEG_LAYER_III, 0.1},
  };
  for (const Case& c : cases) {
    const std::string file = c.file;
    CAPTURE(file);
    SF_INFO probe{};
    probe.samplerate = 48000;
    probe.channels = 1;
    probe.format = c.format;
    if (!sf_format_check(&probe)) {
      MESSAGE("this libsndfile build does not write " << file);
      continue;
    }
    const std::string p = dir.file(c.file);
    write_audio(p, c.format, 48000, 1, x);
    Audio a = read_audio(p);
    CHECK(a.sample_rate == 48000);
    if (c.rms == 0) {
      CHECK(a.samples == x);
    } else {
      // Codecs add priming samples; compare the middle, aligned by the best of a few lags.
      double best = 1e9;
      for (int lag = 0; lag < 2000 && lag + 2400 < static_cast<int>(a.samples.size()); ++lag)
        best = std::min(best, rms_error(std::vector<float>(x.begin() + 1200, x.begin() + 2400),
                                        std::vector<float>(a.samples.begin() + 1200 + lag, a.samples.begin() + 2400 + lag)));
      CHECK(best < c.rms);
    }
  }
}

TEST_CASE("audio: channels are downmixed to their mean; another rate is resampled by libsoxr to the asked one") {
  TempDir dir;
  const std::string p = dir.file("stereo.flac");
  std::vector<float> frames;
  for (int i = 0; i < 8; ++i) {
    frames.push_back(i / 16.f);
    frames.push_back(-i / 32.f);
  }
  write_audio(p, SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 8000, 2, frames);
  Audio a = read_audio(p);
  CHECK(a.channels == 2);
  for (int i = 0; i < 8; ++i) CHECK(a.samples[i] == (i / 16.f + -i / 32.f) * 0.5f);
  // 16 kHz tone read at 8 kHz: half the samples, the same 220 Hz tone.
  const std::string q = dir.file("tone16k.wav");
  const std::vector<float> x = tone(16000, 16000);
  write_audio(q, SF_FORMAT_WAV | SF_FORMAT_FLOAT, 16000, 1, x);
  Audio r = read_audio(q, 8000);
  CHECK(r.sample_rate == 8000);
  CHECK(r.file_rate == 16000);
  CHECK(std::abs(static_cast<int>(r.samples.size()) - 8000) <= 1);
  std::vector<float> every_other;
  for (size_t i = 0; i < x.size(); i += 2) every_other.push_back(x[i]);
  CHECK(rms_error(std::vector<float>(every_other.begin() + 200, every_other.end() - 200),
                  std::vector<float>(r.samples.begin() + 200, r.samples.begin() + (every_other.size() - 200))) < 0.01);
}

TEST_CASE("a data directory: audio files of any extension in any case count; mixed rates are refused naming the file "
          "unless data.sample_rate resamples them; a dangling symbolic link is an error naming it") {
  TempDir dir;
  std::filesystem::create_directories(dir.file("clips"));
  write_audio(dir.file("clips/a.wav"), SF_FORMAT_WAV | SF_FORMAT_PCM_16, 8000, 1, tone(800, 8000));
  write_audio(dir.file("clips/B.FLAC"), SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 8000, 1, tone(800, 8000));
  write_bytes(dir.file("clips/notes.txt"), "not audio");
  DataConfig c;
  c.sources = {{dir.file("clips"), 1.0, ""}};
  c.holdout_every = 2;
  Dataset d = load_dataset(c);
  CHECK(d.sources[0].rows() + d.validation.rows() == 2 * 800 / c.frame);
  write_audio(dir.file("clips/c.ogg"), SF_FORMAT_OGG | SF_FORMAT_VORBIS, 16000, 2, std::vector<float>(3200, 0.1f));
  CHECK_THROWS_WITH_AS(load_dataset(c), doctest::Contains((dir.file("clips/c.ogg") + ": sample rate 16000 Hz differs "
                                                           "from the 8000 Hz of").c_str()), Error);
  c.sample_rate = 8000;
  d = load_dataset(c);
  CHECK(d.description.find("3 audio clips at 8000 Hz (1 resampled") != std::string::npos);
  std::filesystem::create_symlink(dir.file("clips/gone.wav"), dir.file("clips/d.wav"));
  CHECK_THROWS_WITH_AS(load_dataset(c), doctest::Contains(fmt::format("data source '{}': d.wav is a symbolic link to a "
                                                                      "missing file", dir.file("clips")).c_str()),
                       Error);
}

TEST_CASE("unreadable, empty or non-finite audio files give errors naming the file and the problem") {
  TempDir dir;
  std::string p = dir.file("bad.wav");
  auto expect = [&](const std::string& what) {
    CHECK_THROWS_WITH_AS(read_audio(p), doctest::Contains(what.c_str()), Error);
    CHECK_THROWS_WITH_AS(read_audio(p), doctest::Contains(p.c_str()), Error);
  };
  SUBCASE("missing file") {
    p = dir.file("absent.wav");
    expect("cannot open");
  }
  SUBCASE("a directory") {
    p = dir.path().string();
    expect("is a directory, not a regular file");
  }
  SUBCASE("not audio") {
    write_bytes(p, "RIFX" + riff_wave(chunk("fmt ", fmt_body(1, 1, 8000, 16)) + chunk("data", pcm16({1, 2}))).substr(4));
    expect("not an audio file libsndfile reads");
  }
  SUBCASE("a data chunk before its fmt chunk") {
    write_bytes(p, riff_wave(chunk("data", pcm16({1, 2})) + chunk("fmt ", fmt_body(1, 1, 8000, 16))));
    expect("not an audio file libsndfile reads");
  }
  SUBCASE("no samples") {
    write_bytes(p, riff_wave(chunk("fmt ", fmt_body(1, 1, 8000, 16)) + chunk("data", "")));
    expect("no samples (empty file)");
  }
  SUBCASE("NaN in a float file") {
    write_audio(p, SF_FORMAT_WAV | SF_FORMAT_FLOAT, 8000, 2, {0.f, 0.1f, 0.2f, std::nanf("")});
    expect("sample 1 of channel 1 is nan");
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

TEST_CASE("audio that ends before its header's promise is refused with the frames promised and found, never read short") {
  TempDir dir;
  std::vector<int16_t> ten(8000);
  for (size_t i = 0; i < ten.size(); ++i) ten[i] = static_cast<int16_t>(i % 200 * 100 - 10000);
  const std::string whole = riff_wave(chunk("fmt ", fmt_body(1, 1, 8000, 16)) + chunk("data", pcm16(ten)));
  const std::string p = dir.file("cut.wav");
  // Cut to half its bytes: libsndfile alone opens it as a clip of half the length.
  write_bytes(p, whole.substr(0, 44 + 8000));
  CHECK_THROWS_WITH_AS(read_audio(p), doctest::Contains(fmt::format("{}: truncated: its header promises 8000 frames "
                       "(1.00 s) but the file holds 4000 (0.50 s)", p).c_str()), Error);
  // A streaming writer's "length unknown" is not a promise.
  std::string streamed = whole;
  streamed.replace(40, 4, le32(0xFFFFFFFFu));
  write_bytes(p, streamed);
  CHECK(read_audio(p).samples.size() == 8000);
  // A file that shrinks while it is read: the first block came, the rest did not.
  std::vector<int16_t> long_clip(200000, 1000);
  write_bytes(p, riff_wave(chunk("fmt ", fmt_body(1, 1, 8000, 16)) + chunk("data", pcm16(long_clip))));
  AudioReader reader(p);
  std::vector<float> got;
  REQUIRE(reader.read(1000, got) == 1000);
  std::filesystem::resize_file(p, 44 + 2 * 100000);
  CHECK_THROWS_WITH_AS(while (reader.read(1 << 16, got) > 0) {}, doctest::Contains(fmt::format("{}: {} frames could be "
                       "decoded of the 200000 its header promises", p, 100000).c_str()), Error);
}

TEST_CASE("audio that gives no sample at the asked rate is refused, and so is writing an empty file") {
  TempDir dir;
  const std::string p = dir.file("two.wav");
  write_bytes(p, riff_wave(chunk("fmt ", fmt_body(1, 1, 48000, 16)) + chunk("data", pcm16({100, 200}))));
  CHECK(read_audio(p).samples.size() == 2);
  CHECK_THROWS_WITH_AS(read_audio(p, 8000), doctest::Contains(fmt::format("{}: 2 frames at 48000 Hz resample to no "
                       "sample at 8000 Hz", p).c_str()), Error);
  const std::string out = dir.file("out.flac");
  CHECK_THROWS_WITH_AS(convert_audio(p, out, 8000, AudioEncoding::flac16), doctest::Contains("resample to no sample"),
                       Error);
  CHECK_THROWS_WITH_AS(write_audio(out, {}, 8000, AudioEncoding::flac16), doctest::Contains("zero samples"), Error);
  // Nothing was left behind: no output, no temporary.
  CHECK(std::distance(std::filesystem::directory_iterator(dir.path()), {}) == 1);
}

TEST_CASE("a data set larger than the memory available is planned from its headers and read window by window") {
  TempDir dir;
  std::filesystem::create_directories(dir.file("clips"));
  for (int i = 0; i < 3; ++i)
    write_bytes(dir.file(fmt::format("clips/{}.wav", i)), riff_wave(chunk("fmt ", fmt_body(1, 1, 8000, 16)) +
                                                           chunk("data", pcm16(std::vector<int16_t>(1000 * (i + 1), 7)))));
  DataConfig c;
  c.frame = 100;
  c.holdout_every = 3;
  c.sources = {{dir.file("clips"), 1.0, ""}};
  // 6000 samples would need 24000 bytes in memory; 1000 are available,
  // and nothing is decoded to plan the run.
  ::setenv("VQDDP_MEMORY_AVAILABLE", "1000", 1);
  Dataset d = load_dataset(c);
  ::unsetenv("VQDDP_MEMORY_AVAILABLE");
  CHECK(d.sources[0].rows() == 30);  // clips 0 and 1; clip 2 held out
  CHECK(d.validation.rows() == 30);
  std::vector<float> row(100);
  d.validation.read(29, row.data());
  CHECK(row[99] == 7.f / 32768);
  // A missing directory says how to make one, or the config's own way.
  c.sources = {{dir.file("absent"), 1.0, "vqddp convert a.wav --out absent"}};
  CHECK_THROWS_WITH_AS(load_dataset(c), doctest::Contains("this config's data is made first, by `vqddp convert a.wav "
                       "--out absent`"), Error);
}

TEST_CASE("a window read alone is the whole file's samples at its rate, a pure function of (file, window) when "
          "resampled, and a file cut after indexing is refused naming it") {
  TempDir dir;
  std::vector<float> stereo(2 * 9000);
  for (size_t i = 0; i < stereo.size(); ++i) stereo[i] = 0.5f * std::sin(0.001f * float(i * i % 7919)) + 0.01f * float(i % 3);
  const std::vector<std::pair<std::string, int>> files{{"a.wav", SF_FORMAT_WAV | SF_FORMAT_PCM_16},
                                                       {"b.flac", SF_FORMAT_FLAC | SF_FORMAT_PCM_16},
                                                       {"c.wav", SF_FORMAT_WAV | SF_FORMAT_FLOAT},
                                                       {"d.ogg", SF_FORMAT_OGG | SF_FORMAT_VORBIS},
                                                       {"f.opus", SF_FORMAT_OGG | SF_FORMAT_OPUS},
                                                       {"e.mp3", SF_FORMAT_MPEG | SF_FORMAT_MPEG_LAYER_III}};
  for (const auto& [name, format] : files) {
    CAPTURE(name);
    const std::string p = dir.file(name);
    write_audio(p, format, 16000, 2, stereo);
    const std::vector<float> whole = read_audio(p).samples;
    REQUIRE(whole.size() == 9000);
    std::vector<float> w(700);
    for (int64_t first : {0, 1, 4093, 8300}) {
      read_audio_window(p, 0, first, 700, w.data());
      CHECK(std::equal(w.begin(), w.end(), whole.begin() + first));
    }
    // Resampled to 6 kHz (grids meet every 8 file frames, 3 samples): each
    // window the same however it is reached, and close to the whole file's.
    const std::vector<float> low = read_audio(p, 6000).samples;
    std::vector<float> again(700);
    double worst = 0;
    for (int64_t first : {0, 1, 1700, 2674}) {
      read_audio_window(p, 6000, first, 700, w.data());
      read_audio_window(p, 6000, first, 700, again.data());
      CHECK(w == again);
      for (int i = 0; i < 700; ++i) worst = std::max(worst, double(std::abs(w[i] - low[first + i])));
    }
    CHECK(worst < 1e-4);
    CHECK_THROWS_WITH_AS(read_audio_window(p, 0, 8500, 700, w.data()),
                         doctest::Contains((p + ": samples up to 9200 at 16000 Hz are asked of a file of 9000 frames").c_str()),
                         Error);
  }
  // A source built, then its file cut: the row is refused naming the file.
  const std::string p = dir.file("a.wav");
  AudioWindows windows({audio_clip(p)}, 16000, 1000);
  REQUIRE(windows.rows() == 9);
  std::vector<float> row(1000);
  windows.read(6, row.data());
  std::filesystem::resize_file(p, 44 + 4 * 5000);  // 5000 frames of 2 x 16 bit
  // Every row of it, even one the cut file still holds: its bytes are not
  // the indexed file's.
  for (int64_t r : {4, 6})
    CHECK_THROWS_WITH_AS(windows.read(r, row.data()), doctest::Contains((p + ": changed since it was indexed (36044 "
                         "bytes then, 20044 now").c_str()), Error);
}
