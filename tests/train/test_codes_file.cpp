// train/codes_file.h: codes files are bit-packed, every byte of them (the
// metadata included) is under a checksum, and a file whose metadata does
// not fit its codes is refused by name.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/core/file_io.h"
#include "engine/core/safetensors.h"
#include "tests/engine/tmpdir.h"
#include "tool/inspect.h"
#include "train/codes_file.h"

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

TEST_CASE("a codes file packs each code in ceil(log2 K) bits and reads back the same codes and metadata") {
  CHECK(code_bits(1) == 0);
  CHECK(code_bits(2) == 1);
  CHECK(code_bits(256) == 8);
  CHECK(code_bits(257) == 9);
  CHECK(code_bits(1000) == 10);
  TempDir dir;
  const std::string path = dir.file("clip.codes.safetensors");
  const CodesFile c = ten_seconds();
  write_codes_file(path, c);
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
  write_codes_file(path, odd);
  CHECK(std::filesystem::file_size(path) < 2000 * 16 / 8 + 1000);
  CHECK(read_codes_file(path).codes == odd.codes);
  // A code outside its codebook is not written.
  odd.codes[2] = 1000;
  CHECK_THROWS_WITH_AS(write_codes_file(path, odd), doctest::Contains("code 1000 of layer 2 in row 0"), Error);
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

TEST_CASE("an edited metadata value, a flipped code bit, a stray padding bit or a size mismatch is refused by name") {
  TempDir dir;
  const std::string path = dir.file("a.codes.safetensors");
  write_codes_file(path, ten_seconds());
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
  write_codes_file(path, odd);
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
}

TEST_CASE("inspect reads a codes file: its audio, layers, packed size and entropy") {
  TempDir dir;
  const std::string path = dir.file("a.codes.safetensors");
  write_codes_file(path, ten_seconds());
  const std::string text = inspect_file(path);
  CHECK(text.find("codes file format 2, checksums verified (codes and metadata)") != std::string::npos);
  CHECK(text.find("80000 samples at 8000 Hz (10.00 s), source clip.wav") != std::string::npos);
  CHECK(text.find("50 frames of 1600 samples x 40 tokens = 2000 rows x 4 layers") != std::string::npos);
  CHECK(text.find("packed 6.400 kbit/s") != std::string::npos);
  CHECK(text.find("weights fingerprint 0123abcd, checkpoint step 600") != std::string::npos);
}
