// train/codes_file.h: codes files are entropy-coded (format 3: a range coder
// under the codec's code model, in chunks that decode alone) or bit-packed
// (format 2, still read); every byte of them (the metadata included) is
// under a checksum, and a file whose metadata does not fit its codes is
// refused by name. train/range_coder.h: exact round trips at the ideal length.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/core/file_io.h"
#include "engine/core/safetensors.h"
#include "tests/engine/tmpdir.h"
#include "tool/inspect.h"
#include "train/codes_file.h"
#include "train/range_coder.h"

using namespace vqddp;
using vqddp::test::TempDir;

namespace {

// 10 s at 8 kHz in frames of 1600 samples, 40 tokens a frame, 4 layers of
// 256 codes: the main job's 6.4 kbit/s.
CodesFile ten_seconds() {
  CodesFile c;
  c.sample_rate = 8000;
  c.samples = 80000;
  c.frame = 1600;
  c.tokens = 40;
  c.layers = 4;
  c.codebook_sizes = {256, 256, 256, 256};
  c.codec_fingerprint = "0123abcd";
  c.checkpoint_step = 600;
  c.source = "clip.wav";
  for (int64_t i = 0; i < 50 * 40 * 4; ++i) c.codes.push_back((i * 37 + i / 7) % 256);
  return c;
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void put_bytes(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

}  // namespace

TEST_CASE("a format-2 codes file packs each code in ceil(log2 K) bits and reads back the same codes and metadata") {
  CHECK(code_bits(1) == 0);
  CHECK(code_bits(2) == 1);
  CHECK(code_bits(256) == 8);
  CHECK(code_bits(257) == 9);
  CHECK(code_bits(1000) == 10);
  TempDir dir;
  const std::string path = dir.file("clip.codes.safetensors");
  const CodesFile c = ten_seconds();
  write_codes_file_format2(path, c);
  // The codes are 8,000 bytes; the whole file, header included, at most 1.5x that.
  CHECK(std::filesystem::file_size(path) <= 12000);
  CHECK(codes_packed_bitrate(c) == 6400.0);
  const CodesFile r = read_codes_file(path);
  CHECK(r.format == 2);
  CHECK(r.metadata_checked);
  CHECK(r.codes == c.codes);
  CHECK(r.codebook_sizes == c.codebook_sizes);
  CHECK((r.samples == c.samples && r.frame == c.frame && r.tokens == c.tokens && r.sample_rate == c.sample_rate));
  CHECK((r.codec_fingerprint == c.codec_fingerprint && r.checkpoint_step == 600 && r.source == "clip.wav"));
  // Uneven widths (1, 5 and 10 bits) across byte edges, and a codebook of one (0 bits).
  CodesFile odd = c;
  odd.layers = 4;
  odd.codebook_sizes = {2, 17, 1000, 1};
  for (size_t i = 0; i < odd.codes.size(); ++i) odd.codes[i] %= odd.codebook_sizes[i % 4];
  write_codes_file_format2(path, odd);
  CHECK(std::filesystem::file_size(path) < 2000 * 16 / 8 + 1000);
  CHECK(read_codes_file(path).codes == odd.codes);
  // A code outside its codebook is not written.
  odd.codes[2] = 1000;
  CHECK_THROWS_WITH_AS(write_codes_file_format2(path, odd), doctest::Contains("code 1000 of layer 2 in row 0"), Error);
}

TEST_CASE("the entropy of the codes is what an entropy coder would reach: 0 for one code, log2 K for all alike") {
  CodesFile c = ten_seconds();
  std::fill(c.codes.begin(), c.codes.end(), 5);
  CHECK(codes_entropy_bitrate(c) == 0.0);
  for (int64_t r = 0; r < 2000; ++r)
    for (int64_t l = 0; l < 4; ++l) c.codes[r * 4 + l] = r % 2 == 0 ? 0 : 1 + l;  // two codes, half and half
  CHECK(codes_entropy_bitrate(c) == doctest::Approx(2000 * 4 * 1.0 / 10.0));  // 1 bit a code
  CHECK(codes_entropy_bitrate(c, 1) == doctest::Approx(2000 * 1.0 / 10.0));
}

TEST_CASE("format 2: an edited metadata value, a flipped code bit, a stray padding bit or a size mismatch is refused by name") {
  TempDir dir;
  const std::string path = dir.file("a.codes.safetensors");
  write_codes_file_format2(path, ten_seconds());
  const std::string good = bytes_of(path);
  auto refused = [&](const std::string& bytes, const char* what) {
    const std::string p = dir.file("bad.codes.safetensors");
    put_bytes(p, bytes);
    CHECK_THROWS_WITH_AS(read_codes_file(p), doctest::Contains(what), Error);
    CHECK_THROWS_WITH_AS(read_codes_file(p), doctest::Contains(p.c_str()), Error);
  };
  // "samples": "80000" edited in place to "79999" (same length): the metadata checksum.
  std::string edited = good;
  const size_t at = edited.find("\"80000\"");
  REQUIRE(at != std::string::npos);
  edited.replace(at, 7, "\"79999\"");
  refused(edited, "__metadata__ is damaged or was edited");
  // A code bit: the codes' checksum.
  std::string flipped = good;
  flipped.back() = static_cast<char>(flipped.back() ^ 4);
  refused(flipped, "tensor 'codes' is damaged");
  // The metadata checksum removed (renamed, same length): a codes file must have it.
  std::string unchecked = good;
  unchecked.replace(unchecked.find("vqddp.metadata_crc32c"), 21, "vqddp.unused_metadata");
  refused(unchecked, "must carry checksums of its codes and its metadata");
  // Files whose checksums fit but whose codes do not fit their metadata.
  SafetensorsFile f = safetensors_load(path);
  std::string packed = f.bytes[0].second;
  auto resaved = [&](const std::map<std::string, std::string>& meta, const std::string& codes) {
    const std::string p = dir.file("resaved.codes.safetensors");
    safetensors_save(p, {}, meta, {{"codes", codes}});
    return bytes_of(p);
  };
  refused(resaved(f.metadata, packed.substr(1)), "tensor 'codes' has 7999 bytes");
  std::map<std::string, std::string> meta = f.metadata;
  meta["bits"] = "[8,8,8,7]";
  refused(resaved(meta, packed), "layer 3: 7 bits for a codebook of 256");
  meta = f.metadata;
  meta["samples"] = "79999";  // still 50 frames: fits
  CHECK_NOTHROW(read_codes_file((put_bytes(dir.file("ok.codes.safetensors"), resaved(meta, packed)),
                                 dir.file("ok.codes.safetensors"))));
  meta["samples"] = "80001";  // 51 frames: more rows than the codes hold
  refused(resaved(meta, packed), "tensor 'codes' has 8000 bytes");
  // A stray bit in the padding after the last code: one frame of 3 tokens
  // x 3 layers of 1 bit is 9 bits, so 2 bytes with 7 bits of padding.
  CodesFile odd = ten_seconds();
  odd.samples = 1600;
  odd.tokens = 3;
  odd.layers = 3;
  odd.codebook_sizes = {2, 2, 2};
  odd.codes.assign(3 * 3, 1);
  write_codes_file_format2(path, odd);
  f = safetensors_load(path);
  packed = f.bytes[0].second;
  REQUIRE(packed.size() == 2);
  packed[1] = static_cast<char>(packed[1] | 0x80);
  refused(resaved(f.metadata, packed), "padding bits after the last code are not zero");
  // Crafted headers under valid checksums that ask for more codes than the
  // payload holds: 2^40 samples in frames of 1 with 2^20 tokens (2^60 rows,
  // whose products with the bits and layers wrapped to 0 before) and no
  // payload; 4095 one-code layers beside one of two codes (0 bits each, so
  // 262,145 one-bit rows in 32 KiB are 2^30 + 4095 codes); no bits at all.
  meta = f.metadata;
  meta["samples"] = std::to_string(int64_t{1} << 40);
  meta["frame"] = "1";
  meta["tokens"] = std::to_string(int64_t{1} << 20);
  meta["layers"] = "16";
  meta["codebook_sizes"] = nlohmann::json(std::vector<int64_t>(16, 2)).dump();
  meta["bits"] = nlohmann::json(std::vector<int64_t>(16, 1)).dump();
  refused(resaved(meta, ""), "tensor 'codes' has 0 bytes, far too few for 1099511627776 samples");
  std::vector<int64_t> sizes(4096, 1);
  sizes[0] = 2;
  std::vector<int64_t> widths(4096, 0);
  widths[0] = 1;
  meta["samples"] = "262145";
  meta["tokens"] = "1";
  meta["layers"] = "4096";
  meta["codebook_sizes"] = nlohmann::json(sizes).dump();
  meta["bits"] = nlohmann::json(widths).dump();
  refused(resaved(meta, std::string(32769, '\0')), "more codes than a codes file may hold");
  sizes[0] = 1;
  widths[0] = 0;
  meta["codebook_sizes"] = nlohmann::json(sizes).dump();
  meta["bits"] = nlohmann::json(widths).dump();
  refused(resaved(meta, ""), "its codes carry no bits");
  // Not a codes file at all.
  meta = f.metadata;
  meta["format"] = "vqddp-codes/9";
  refused(resaved(meta, f.bytes[0].second), "not a vqddp codes file (format 'vqddp-codes/9'");
  // A format-2 file still reads without a code model.
  CHECK(read_codes_file(path).codes == odd.codes);
}

TEST_CASE("inspect reads a format-2 codes file: its audio, layers, packed size and entropy") {
  TempDir dir;
  const std::string path = dir.file("a.codes.safetensors");
  write_codes_file_format2(path, ten_seconds());
  const std::string text = inspect_file(path);
  CHECK(text.find("codes file format 2, checksums verified (codes and metadata)") != std::string::npos);
  CHECK(text.find("80000 samples at 8000 Hz (10.00 s), source clip.wav") != std::string::npos);
  CHECK(text.find("50 frames of 1600 samples x 40 tokens = 2000 rows x 4 layers") != std::string::npos);
  CHECK(text.find("packed 6.400 kbit/s") != std::string::npos);
  CHECK(text.find("weights fingerprint 0123abcd, checkpoint step 600") != std::string::npos);
}

// ---- the range coder ----

namespace {

double ideal_bits(const FrequencyTable& t, const std::vector<uint32_t>& symbols) {
  double bits = 0;
  for (uint32_t s : symbols) bits -= std::log2(static_cast<double>(t.freq[s]) / kTotal);
  return bits;
}

// A table of k symbols, skewed by `skew` (0: uniform), each at least 1.
FrequencyTable table_of(int64_t k, double skew, std::mt19937_64& rng) {
  std::vector<double> w(static_cast<size_t>(k));
  std::uniform_real_distribution<double> u(0, 1);
  for (auto& x : w) x = std::exp(skew * u(rng) * 10);
  CodeModel m = CodeModel::from_counts({k}, {w});
  return FrequencyTable(m.frequencies(0));
}

std::vector<uint32_t> draw(const FrequencyTable& t, size_t n, std::mt19937_64& rng) {
  std::uniform_int_distribution<uint32_t> u(0, kTotal - 1);
  std::vector<uint32_t> out;
  for (size_t i = 0; i < n; ++i) out.push_back(t.find(u(rng)));
  return out;
}

}  // namespace

TEST_CASE("the range coder decodes exactly what it encoded, within 1% and a few bytes of the ideal length") {
  std::mt19937_64 rng(7);
  for (int64_t k : {1, 2, 3, 16, 256, 1000, 65535, 65536})
    for (double skew : {0.0, 0.3, 1.0, 2.0}) {
      CAPTURE(k);
      CAPTURE(skew);
      const FrequencyTable t = table_of(k, skew, rng);
      REQUIRE(t.cum.back() == kTotal);
      for (size_t n : {size_t{0}, size_t{1}, size_t{5}, size_t{20000}}) {
        const std::vector<uint32_t> sym = draw(t, n, rng);
        RangeEncoder enc;
        for (uint32_t s : sym) enc.encode(t, s);
        const std::string bytes = enc.finish();
        RangeDecoder dec(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
        std::vector<uint32_t> back;
        for (size_t i = 0; i < n; ++i) back.push_back(dec.decode(t));
        REQUIRE(back == sym);
        const double ideal = ideal_bits(t, sym) / 8;
        CHECK(static_cast<double>(bytes.size()) <= ideal * 1.01 + 5);
      }
    }
  // Extremes: one symbol of frequency 65535 and the rest 1 (long runs of
  // the likely one: carries through runs of 0xff), then the unlikely ones.
  std::vector<uint32_t> f(256, 1);
  f[0] = kTotal - 255;
  const FrequencyTable skewed(f);
  std::vector<uint32_t> sym(100000, 0);
  for (size_t i = 0; i < sym.size(); i += 997) sym[i] = static_cast<uint32_t>(i % 256);
  for (size_t i = 50000; i < 50300; ++i) sym[i] = 255;
  RangeEncoder enc;
  for (uint32_t s : sym) enc.encode(skewed, s);
  const std::string bytes = enc.finish();
  CHECK(static_cast<double>(bytes.size()) <= ideal_bits(skewed, sym) / 8 * 1.01 + 5);
  RangeDecoder dec(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  for (size_t i = 0; i < sym.size(); ++i) REQUIRE(dec.decode(skewed) == sym[i]);
  // Raw bits between table symbols; any bytes decode to symbols inside the table.
  RangeEncoder mixed;
  for (uint32_t i = 0; i < 1000; ++i) {
    mixed.encode_bits(i * 40503u & 0xffff, 16);
    mixed.encode(skewed, i % 3);
    mixed.encode_bits(i & 1, 1);
  }
  const std::string m = mixed.finish();
  RangeDecoder md(reinterpret_cast<const unsigned char*>(m.data()), m.size());
  for (uint32_t i = 0; i < 1000; ++i) {
    REQUIRE(md.decode_bits(16) == (i * 40503u & 0xffff));
    REQUIRE(md.decode(skewed) == i % 3);
    REQUIRE(md.decode_bits(1) == (i & 1));
  }
  const std::string junk(64, '\xff');
  RangeDecoder jd(reinterpret_cast<const unsigned char*>(junk.data()), junk.size());
  for (int i = 0; i < 1000; ++i) REQUIRE(jd.decode(skewed) < 256);
  CHECK_THROWS_AS(FrequencyTable(std::vector<uint32_t>{1, 2}), Error);       // sums to 3
  CHECK_THROWS_AS(FrequencyTable(std::vector<uint32_t>{0, kTotal}), Error);  // a symbol of 0
}

// ---- format 3 ----

namespace {

void put_varint(std::string& out, uint64_t v) {
  do {
    out.push_back(static_cast<char>((v & 0x7f) | (v >= 0x80 ? 0x80 : 0)));
    v >>= 7;
  } while (v);
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

// A format-3 header as train/codes_file.h lays it out, its CRC included.
struct Header {
  uint64_t rate = 8000, samples = 80000, frame = 1600, tokens = 40;
  std::vector<uint64_t> sizes = {256, 256, 256, 256};
  uint32_t fingerprint = 0x0123abcd;
  uint64_t step = 600;
  uint32_t model_crc = 0;
  uint64_t chunk_frames = 256;
  std::string source = "clip.wav";

  std::string bytes(uint32_t* crc = nullptr) const {
    std::string out = "VQDC\x03";
    for (uint64_t v : {rate, samples, frame, tokens, static_cast<uint64_t>(sizes.size())}) put_varint(out, v);
    for (uint64_t k : sizes) put_varint(out, k);
    put_u32(out, fingerprint);
    put_varint(out, step);
    put_u32(out, model_crc);
    put_varint(out, chunk_frames);
    put_varint(out, source.size());
    out += source;
    const uint32_t c = crc32c(out.data(), out.size());
    if (crc) *crc = c;
    put_u32(out, c);
    return out;
  }
};

std::string chunk_bytes(uint32_t header_crc, uint32_t index, const std::string& payload) {
  std::string n, out;
  put_u32(n, index);
  put_varint(out, payload.size());
  put_u32(out, crc32c(payload.data(), payload.size(), crc32c(n.data(), n.size(), header_crc)));
  return out + payload;
}

// Skewed tables (code k's count 0.9^k) and 10 s of codes drawn from them.
CodeModel skewed_model() {
  std::vector<double> w;
  for (int k = 0; k < 256; ++k) w.push_back(std::pow(0.9, k));
  return CodeModel::from_counts({256, 256, 256, 256}, {w, w, w, w});
}

CodesFile skewed_ten_seconds(const CodeModel& m) {
  CodesFile c = ten_seconds();
  std::mt19937_64 rng(3);
  const FrequencyTable t(m.frequencies(0));
  std::uniform_int_distribution<uint32_t> u(0, kTotal - 1);
  for (auto& v : c.codes) v = t.find(u(rng));
  return c;
}

}  // namespace

TEST_CASE("format 3: a header of a few dozen bytes, codes within 1.03x their ideal length, read back bit for bit") {
  const CodeModel m = skewed_model();
  CHECK(m.counted(0));
  CHECK(m.frequencies(0)[0] > m.frequencies(0)[100]);
  CHECK(m.frequencies(0)[255] == 1);  // the floor
  const CodesFile c = skewed_ten_seconds(m);
  TempDir dir;
  const std::string path = dir.file("clip.codes");
  write_codes_file(path, c, m);
  const std::string bytes = bytes_of(path);
  // The layout of train/codes_file.h, byte for byte: 5 + 2 + 3 + 2 + 1 + 1 +
  // 4 x 2 + 4 + 2 + 4 + 2 + 1 + 8 + 4 = 47 bytes of header with "clip.wav".
  Header h;
  h.model_crc = m.crc(4);
  uint32_t header_crc = 0;
  const std::string head = h.bytes(&header_crc);
  CHECK(head.size() == 47);
  REQUIRE(bytes.compare(0, head.size(), head) == 0);
  // One chunk of 50 frames: its length, CRC and payload end the file.
  RangeEncoder enc;
  const FrequencyTable t(m.frequencies(0));
  for (int64_t v : c.codes) enc.encode(t, static_cast<uint32_t>(v));
  CHECK(bytes == head + chunk_bytes(header_crc, 0, enc.finish()));
  const double ideal = codes_ideal_bits(c, m) / 8;
  MESSAGE("10 s, skewed: packed 8000 bytes, file ", bytes.size(), ", ideal ", ideal);
  CHECK(static_cast<double>(bytes.size()) <= 1.03 * ideal);
  const CodesFile r = read_codes_file(path, &m);
  CHECK(r.format == 3);
  CHECK(r.metadata_checked);
  CHECK(r.codes == c.codes);
  CHECK((r.samples == c.samples && r.frame == c.frame && r.tokens == c.tokens && r.sample_rate == c.sample_rate));
  CHECK((r.codec_fingerprint == c.codec_fingerprint && r.checkpoint_step == 600 && r.source == "clip.wav"));
  CHECK(r.codebook_sizes == c.codebook_sizes);
  // Uniform tables (a quantizer without counts): about the packed size.
  const CodeModel u = CodeModel::uniform({256, 256, 256, 256});
  CHECK(!u.counted(0));
  write_codes_file(path, c, u);
  CHECK(std::filesystem::file_size(path) <= 8000 + 47 + 20);
  CHECK(read_codes_file(path, &u).codes == c.codes);
  // All codes 0 (silence through a codec without counts, say): the coder's
  // bytes are all zeros, and every one of them is kept, so the reader's
  // bound on a chunk's rows holds; under skewed tables too.
  CodesFile zeros = c;
  std::fill(zeros.codes.begin(), zeros.codes.end(), 0);
  for (const CodeModel* model : {&u, &m}) {
    write_codes_file(path, zeros, *model);
    CHECK(read_codes_file(path, model).codes == zeros.codes);
  }
  // Odd sizes, a codebook of one, one past 2^16 (raw bits), an empty source
  // name, chunks of 7 frames: the same codes back.
  CodesFile odd = ten_seconds();
  odd.codebook_sizes = {2, 1, 65537, 1000};
  odd.source.clear();
  odd.chunk_frames = 7;
  for (size_t i = 0; i < odd.codes.size(); ++i) odd.codes[i] = (static_cast<int64_t>(i) * 7919) % odd.codebook_sizes[i % 4];
  const CodeModel om = CodeModel::uniform(odd.codebook_sizes);
  write_codes_file(path, odd, om);
  const CodesFile ro = read_codes_file(path, &om);
  CHECK(ro.codes == odd.codes);
  CHECK(ro.source.empty());
  CHECK(ro.chunks() == 8);
  // A code outside its codebook is not written; nor with tables of other sizes.
  odd.codes[3] = 1000;
  CHECK_THROWS_WITH_AS(write_codes_file(path, odd, om), doctest::Contains("code 1000 of layer 3 in row 0"), Error);
  CHECK_THROWS_WITH_AS(write_codes_file(path, c, om), doctest::Contains("layer 0 has a codebook of 256, its code model's "
                                                                        "table 2"), Error);
}

TEST_CASE("format 3: a damaged chunk is refused by name, the others still read; bad headers, varints, lengths, "
          "counts, tables and truncations are refused by name") {
  const CodeModel m = skewed_model();
  CodesFile c = skewed_ten_seconds(m);
  c.chunk_frames = 16;  // 50 frames: chunks of 16, 16, 16 and 2
  TempDir dir;
  const std::string path = dir.file("a.codes");
  write_codes_file(path, c, m);
  const std::string good = bytes_of(path);
  auto refused = [&](const std::string& bytes, const char* what, bool with_model = true) {
    const std::string p = dir.file("bad.codes");
    put_bytes(p, bytes);
    const CodeModel* model = with_model ? &m : nullptr;
    CHECK_THROWS_WITH_AS(read_codes_file(p, model), doctest::Contains(what), Error);
    CHECK_THROWS_WITH_AS(read_codes_file(p, model), doctest::Contains(p.c_str()), Error);
  };
  Header h;
  h.model_crc = m.crc(4);
  h.chunk_frames = 16;
  uint32_t hcrc = 0;
  const std::string head = h.bytes(&hcrc);
  REQUIRE(good.compare(0, head.size(), head) == 0);
  // Where the chunks are: length (2 bytes here), CRC, payload.
  std::vector<size_t> at;
  for (size_t p = head.size(); p < good.size();) {
    at.push_back(p);
    size_t len = 0, shift = 0, i = p;
    for (;; shift += 7) {
      const auto b = static_cast<uint8_t>(good[i++]);
      len |= static_cast<size_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) break;
    }
    p = i + 4 + len;
  }
  REQUIRE(at.size() == 4);
  // A flipped payload byte in chunk 2: named with its frames and seconds.
  std::string flipped = good;
  flipped[at[1] + 8] ^= 1;
  refused(flipped, "chunk 2 of 4 (frames 16-31, 3.20-6.40 s) is damaged: its checksum does not match");
  {
    put_bytes(dir.file("bad.codes"), flipped);
    CodesReader reader(dir.file("bad.codes"));
    CodesReader::Chunk k;
    std::vector<int64_t> got;
    int damaged = 0;
    while (reader.next(k)) {
      if (k.damaged) {
        ++damaged;
        CHECK(k.index == 1);
        CHECK_THROWS_WITH_AS(reader.codes(k, m), doctest::Contains("chunk 2 of 4"), Error);
        continue;
      }
      const std::vector<int64_t> v = reader.codes(k, m);  // one chunk's codes at a time
      CHECK(static_cast<int64_t>(v.size()) == k.frames * 40 * 4);
      CHECK(std::equal(v.begin(), v.end(), c.codes.begin() + k.first_frame * 40 * 4));
      got.insert(got.end(), v.begin(), v.end());
    }
    CHECK(damaged == 1);
    CHECK(got.size() == c.codes.size() - 16 * 40 * 4);
  }
  // Chunks swapped (each CRC covers its number): both named.
  std::string swapped = good.substr(0, at[0]) + good.substr(at[1], at[2] - at[1]) + good.substr(at[0], at[1] - at[0]) +
                        good.substr(at[2]);
  refused(swapped, "chunk 1 of 4 (frames 0-15, 0.00-3.20 s) is damaged");
  // The header: an edited value under the old CRC, the magic, the version.
  std::string edited = good;
  edited[7] ^= 1;  // samples
  refused(edited, "the header is damaged or was edited", false);
  refused("VQDX" + good.substr(4), "not safetensors", false);  // not format 3, so read as format 1 or 2
  std::string v9 = good;
  v9[4] = 9;
  refused(v9, "a codes file of format 9, which this vqddp does not read", false);
  // Truncated: inside the header, in a chunk's length, in a payload; bytes after the last chunk.
  refused(good.substr(0, 20), "truncated: the file ends inside the header", false);
  refused(good.substr(0, head.size()), "the header promises 4 chunks", false);
  refused(good.substr(0, at[3] + 1), "chunk 4 of 4 (frames 48-49, 9.60-10.00 s) is damaged: its length");
  refused(good.substr(0, good.size() - 1), "chunk 4 of 4 (frames 48-49, 9.60-10.00 s) is damaged");
  refused(good + "x", "1 bytes after the last chunk");
  // Without the model, or under other tables: refused by name.
  refused(good, "reading them needs the checkpoint", false);
  const CodeModel other = CodeModel::uniform({256, 256, 256, 256});
  put_bytes(dir.file("bad.codes"), good);
  CHECK_THROWS_WITH_AS(read_codes_file(dir.file("bad.codes"), &other),
                       doctest::Contains("coded under code model tables with CRC32C"), Error);
  // Crafted headers under a valid CRC: a varint of 11 bytes, one past 64
  // bits, a redundant zero; counts beyond bounds; more codes than a file may
  // hold; more chunks than the bytes can hold; a chunk length past the end;
  // rows a payload cannot hold under the model.
  auto crafted = [&](const Header& x, const std::string& rest = std::string()) {
    return x.bytes() + rest;
  };
  refused(std::string("VQDC\x03", 5) + std::string(11, '\x80'), "the header's sample rate is not a varint (past 64 "
          "bits)", false);
  refused(std::string("VQDC\x03", 5) + std::string(9, '\xff') + "\x02", "not a varint (past 64 bits)", false);
  refused(std::string("VQDC\x03\x80\x00", 7) + good.substr(7), "not a varint (a redundant zero byte)", false);
  Header big = h;
  big.tokens = uint64_t{1} << 21;
  refused(crafted(big), "the header's tokens is 2097152, beyond what a codes file holds", false);
  big = h;
  big.samples = uint64_t{1} << 40;
  big.frame = 1;
  big.tokens = uint64_t{1} << 20;
  refused(crafted(big), "more codes than a codes file may hold", false);
  big = h;
  big.samples = 1600 * 1000;
  big.chunk_frames = 1;
  refused(crafted(big, std::string(100, '\0')), "the header promises 1000 chunks", false);
  big = h;
  big.sizes = {1, 1, 1, 1};
  refused(crafted(big), "its codes carry no bits", false);
  Header one = h;
  one.samples = 1600;
  uint32_t one_crc = 0;
  const std::string one_head = one.bytes(&one_crc);
  std::string long_chunk;
  put_varint(long_chunk, 1000);
  refused(one_head + long_chunk + "abcd" + "xyz", "is damaged: its length (1000 bytes) runs past the end of the file");
  refused(one_head + chunk_bytes(one_crc, 0, "\x01"), "holds 1 bytes, too few for 40 rows of 4 layers");
}

TEST_CASE("inspect reads a format-3 file's header and chunks: its packed and coded sizes and their ratio") {
  const CodeModel m = skewed_model();
  const CodesFile c = skewed_ten_seconds(m);
  TempDir dir;
  const std::string path = dir.file("a.codes");
  write_codes_file(path, c, m);
  const std::string text = inspect_file(path);
  const auto size = std::filesystem::file_size(path);
  CHECK(text.find("codes file format 3, checksums verified (header and 1 chunk of 256 frames)") != std::string::npos);
  CHECK(text.find("80000 samples at 8000 Hz (10.00 s), source clip.wav") != std::string::npos);
  CHECK(text.find("50 frames of 1600 samples x 40 tokens = 2000 rows x 4 layers") != std::string::npos);
  CHECK(text.find("packed 6.400 kbit/s (8000 bytes of codes)") != std::string::npos);
  CHECK(text.find(fmt::format("coded {:.3f} kbit/s ({} bytes in the file, header included): {:.3f} of packed",
                              static_cast<double>(size) * 8 / 10000, size, static_cast<double>(size) / 8000)) !=
        std::string::npos);
  CHECK(text.find(fmt::format("code model CRC32C {:08x}", m.crc(4))) != std::string::npos);
  // A damaged chunk is named, not thrown.
  std::string bytes = bytes_of(path);
  bytes.back() = static_cast<char>(bytes.back() ^ 1);
  put_bytes(path, bytes);
  CHECK(inspect_file(path).find("1 of 1 chunks DAMAGED: chunk 1 of 1 (frames 0-49, 0.00-10.00 s)") != std::string::npos);
}
