// safetensors round trip, every malformed-file case named in the error,
// per-tensor checksums, CRC32C against a bitwise reference, and the removal
// of temporaries a killed save left behind.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/core/file_io.h"
#include "engine/core/output_file.h"
#include "engine/core/safetensors.h"
#include "tests/engine/file_fixtures.h"
#include "tests/engine/tmpdir.h"

using namespace vqddp;
using vqddp::test::TempDir;
using vqddp::test::dead_pid;
using vqddp::test::safetensors_layout;
using vqddp::test::SafetensorsLayout;

namespace {

// Writes an arbitrary header JSON followed by `data` bytes.
void write_raw(const std::string& path, const std::string& header, const std::string& data) {
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << data;
}

}  // namespace

TEST_CASE("safetensors round trip keeps names, order, shapes, dtypes, values and metadata") {
  TempDir dir;
  std::string path = dir.file("a.safetensors");
  Tensor e = from_vector({1.5f, -2.f, 3.25f, 0.f, 1e-30f, -1e30f}, {2, 3});
  Tensor idx = from_vector(std::vector<int64_t>{-1, 0, int64_t{1} << 40}, {3});
  Tensor empty_rows = zeros({0, 4});
  Tensor s = scalar(7.f);
  safetensors_save(path, {{"embed", e}, {"indices.0", idx}, {"empty", empty_rows}, {"step", s}},
                   {{"decay", "0.99"}, {"cosine", "false"}});
  SafetensorsFile f = safetensors_load(path);
  REQUIRE(f.tensors.size() == 4);
  CHECK(f.tensors[0].first == "embed");
  CHECK(f.tensors[1].first == "indices.0");
  CHECK(f.at("embed").to_vector<float>() == e.to_vector<float>());
  CHECK(f.at("embed").shape() == Shape{2, 3});
  CHECK(f.at("indices.0").to_vector<int64_t>() == idx.to_vector<int64_t>());
  CHECK(f.at("empty").shape() == Shape{0, 4});
  CHECK(f.at("step").shape() == Shape{});
  CHECK(f.at("step").item<float>() == 7.f);
  CHECK(f.metadata.at("decay") == "0.99");
  CHECK(f.metadata.at("cosine") == "false");
  CHECK_THROWS_WITH_AS(f.at("nope"), doctest::Contains("no tensor 'nope' (the file holds: embed"), Error);
  // Header length is a multiple of 8 so the data is aligned.
  uint64_t n;
  std::memcpy(&n, read_file(path).data(), 8);
  CHECK(n % 8 == 0);
  // No temporary file is left next to the target.
  int files = 0;
  for (auto& entry : std::filesystem::directory_iterator(dir.path())) files += entry.is_regular_file();
  CHECK(files == 1);
}

TEST_CASE("malformed safetensors files give errors naming the file and the problem") {
  TempDir dir;
  std::string p = dir.file("bad.safetensors");
  std::string eight(8, '\0');
  auto expect = [&](const std::string& what) {
    CHECK_THROWS_WITH_AS(safetensors_load(p), doctest::Contains(what.c_str()), Error);
    CHECK_THROWS_WITH_AS(safetensors_load(p), doctest::Contains(p.c_str()), Error);
  };
  SUBCASE("missing file") {
    p = dir.file("absent.safetensors");
    expect("cannot open");
  }
  SUBCASE("shorter than the length field") {
    std::ofstream(p) << "abc";
    expect("too short");
  }
  SUBCASE("header length beyond the end") {
    write_raw(p, "{}", "");
    std::string b = read_file(p);
    b.resize(b.size() - 1);
    std::ofstream(p, std::ios::binary) << b;
    expect("exceeds the file");
  }
  SUBCASE("header not JSON") {
    write_raw(p, "{not json", "");
    expect("not valid JSON");
  }
  SUBCASE("header not an object") {
    write_raw(p, "[1,2]", "");
    expect("not a JSON object");
  }
  SUBCASE("unknown dtype") {
    write_raw(p, R"({"x":{"dtype":"Q7","shape":[1],"data_offsets":[0,4]}})", "abcd");
    expect("unknown dtype 'Q7'");
  }
  SUBCASE("known but unsupported dtype") {
    write_raw(p, R"({"x":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", "abcd");
    expect("dtype F16, which vqddp does not load");
  }
  SUBCASE("truncated data") {
    write_raw(p, R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", eight);
    expect("pass the end of the data (8 bytes): file truncated?");
  }
  SUBCASE("shape does not match the byte range") {
    write_raw(p, R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight);
    expect("needs 12 bytes, data_offsets give 8");
  }
  SUBCASE("overlapping offsets") {
    write_raw(p,
              R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
              R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
              eight);
    expect("overlap");
  }
  SUBCASE("missing field and bad metadata") {
    write_raw(p, R"({"x":{"dtype":"F32","shape":[1]}})", eight);
    expect("missing 'data_offsets'");
    write_raw(p, R"({"__metadata__":{"k":3}})", "");
    expect("__metadata__ value 'k' is not a string");
  }
  SUBCASE("element count overflowing int64 (a crafted shape must not wrap to a small size)") {
    write_raw(p, R"({"x":{"dtype":"F32","shape":[4611686018427387905],"data_offsets":[0,4]}})", "abcd");
    expect("needs more bytes than 64 bits count");
    write_raw(p, R"({"x":{"dtype":"F32","shape":[4611686018427387904, 4],"data_offsets":[0,4]}})", "abcd");
    expect("more elements than int64 holds");
  }
  SUBCASE("a hole in the data or bytes after the last tensor") {
    write_raw(p, R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight);
    expect("bytes [0, 4] of the data belong to no tensor");
    write_raw(p, R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", eight);
    expect("4 bytes after the last tensor belong to no tensor");
  }
  SUBCASE("negative dimension") {
    write_raw(p, R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "abcd");
    expect("not a non-negative 64-bit integer");
  }
}

TEST_CASE("a save replaces the file by rename: a hard link to the old file keeps the old bytes") {
  TempDir dir;
  std::string path = dir.file("ckpt.safetensors"), link = dir.file("old.safetensors");
  safetensors_save(path, {{"w", ones({3})}});
  std::filesystem::create_hard_link(path, link);
  std::string before = read_file(link);
  safetensors_save(path, {{"w", zeros({5})}});
  // An in-place rewrite (truncate + write) would have changed the linked inode.
  CHECK(read_file(link) == before);
  CHECK(safetensors_load(path).at("w").numel() == 5);
}

TEST_CASE("a save whose rename fails leaves the target and no temporary file") {
  TempDir dir;
  std::string target = dir.file("ckpt.safetensors");
  std::filesystem::create_directories(target + "/occupied");  // rename over a non-empty directory fails
  CHECK_THROWS_WITH_AS(safetensors_save(target, {{"w", ones({1})}}), doctest::Contains("rename"), Error);
  CHECK(std::filesystem::is_directory(target + "/occupied"));
  int entries = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path())) entries += 1 + 0 * e.is_regular_file();
  CHECK(entries == 1);
}

TEST_CASE("a failed save leaves the previous file intact") {
  TempDir dir;
  std::string path = dir.file("ckpt.safetensors");
  safetensors_save(path, {{"w", ones({3})}});
  std::string before = read_file(path);
  // An undefined tensor is refused before anything is written.
  CHECK_THROWS_WITH_AS(safetensors_save(path, {{"w", zeros({3})}, {"bad", Tensor()}}),
                       doctest::Contains("tensor 'bad' is undefined"), Error);
  CHECK(read_file(path) == before);
  // A target directory that does not exist fails at the temporary file.
  CHECK_THROWS_WITH_AS(safetensors_save(dir.file("no/such/dir.safetensors"), {{"w", ones({1})}}),
                       doctest::Contains("the directory"), Error);
  CHECK(read_file(path) == before);
}

namespace {

// CRC32C one bit at a time, straight from the definition: the reference
// the table-driven crc32c must equal.
uint32_t crc32c_bitwise(const std::string& bytes) {
  uint32_t crc = ~0u;
  for (unsigned char b : bytes) {
    crc ^= b;
    for (int i = 0; i < 8; ++i) crc = (crc >> 1) ^ ((crc & 1u) ? 0x82f63b78u : 0u);
  }
  return ~crc;
}

}  // namespace

TEST_CASE("crc32c gives the standard check value and equals the bitwise definition at every length and alignment") {
  CHECK(crc32c("123456789", 9) == 0xe3069283u);
  CHECK(crc32c("", 0) == 0u);
  std::string bytes;
  for (int i = 0; i < 300; ++i) bytes.push_back(static_cast<char>(i * 37 + 11));
  for (size_t begin : {0, 1, 3, 7})
    for (size_t n : {0, 1, 7, 8, 9, 63, 64, 65, 250}) {
      std::string piece = bytes.substr(begin, n);
      CHECK(crc32c(bytes.data() + begin, n) == crc32c_bitwise(piece));
      // Continued from a prefix, as over several buffers.
      CHECK(crc32c(piece.data() + n / 2, n - n / 2, crc32c(piece.data(), n / 2)) == crc32c_bitwise(piece));
    }
}

TEST_CASE("a saved file carries a readable CRC32C per tensor in its metadata, verified and hidden on load") {
  TempDir dir;
  std::string path = dir.file("a.safetensors");
  Tensor w = from_vector({1.f, 2.f, 3.f}, {3});
  safetensors_save(path, {{"w", w}, {"empty", zeros({0})}}, {{"note", "x"}});
  std::string bytes = read_file(path);
  // Any safetensors reader: every metadata value is a string.
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, safetensors_layout(bytes).data_start - 8));
  for (const auto& [key, value] : header["__metadata__"].items()) CHECK(value.is_string());
  nlohmann::json sums = nlohmann::json::parse(header["__metadata__"]["vqddp.crc32c"].get<std::string>());
  CHECK(sums["w"] == fmt::format("{:08x}", crc32c(w.raw_data(), 12)));
  CHECK(sums["empty"] == "00000000");
  SafetensorsFile f = safetensors_load(path);
  CHECK(f.checksummed);
  CHECK(f.metadata == std::map<std::string, std::string>{{"note", "x"}});
  CHECK(f.path == path);
  // The key is the format's: a caller cannot set it.
  CHECK_THROWS_WITH_AS(safetensors_save(path, {{"w", w}}, {{"vqddp.crc32c", "{}"}}),
                       doctest::Contains("metadata key 'vqddp.crc32c' is reserved"), Error);
}

TEST_CASE("one flipped bit in tensor data is refused, naming the file, the tensor and both checksums") {
  TempDir dir;
  std::string path = dir.file("ckpt.safetensors");
  Tensor a = from_vector({1.f, 2.f}, {2}), b = from_vector({3.f, 4.f, 5.f}, {3});
  safetensors_save(path, {{"a", a}, {"b", b}});
  std::string bytes = read_file(path);
  size_t at = safetensors_layout(bytes).data_start + a.nbytes() + 5;  // inside 'b'
  bytes[at] = static_cast<char>(bytes[at] ^ 0x10);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  Tensor damaged = b.clone();
  static_cast<char*>(damaged.raw_data())[5] ^= 0x10;
  std::string want = fmt::format("{}: tensor 'b' is damaged (checksum {:08x}, stored {:08x})", path,
                                 crc32c(damaged.raw_data(), 12), crc32c(b.raw_data(), 12));
  CHECK_THROWS_WITH_AS(safetensors_load(path), doctest::Contains(want.c_str()), Error);
}

TEST_CASE("checksum metadata must be JSON, hold 8 hex digits for every tensor and name no absent one") {
  TempDir dir;
  std::string p = dir.file("sums.safetensors");
  const std::string entry = R"("x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  auto with_sums = [&](const std::string& sums) {
    write_raw(p, "{" + entry + R"(,"__metadata__":{"vqddp.crc32c":)" + nlohmann::json(sums).dump() + "}}", "abcd");
  };
  auto expect = [&](const std::string& what) {
    CHECK_THROWS_WITH_AS(safetensors_load(p), doctest::Contains((p + ": " + what).c_str()), Error);
  };
  const std::string good = fmt::format("{:08x}", crc32c("abcd", 4));
  with_sums(R"({"x":")" + good + R"("})");
  CHECK(safetensors_load(p).checksummed);
  with_sums("{not json");
  expect("__metadata__ 'vqddp.crc32c': not valid JSON");
  with_sums("{}");
  expect("tensor 'x' has no checksum in __metadata__ 'vqddp.crc32c'");
  with_sums(R"({"x":")" + good + R"(","gone":"00000000"})");
  expect("__metadata__ 'vqddp.crc32c' holds 2 checksums for 1 tensors");
  with_sums(R"({"x":"12345"})");
  expect("the checksum of tensor 'x' in __metadata__ 'vqddp.crc32c' is \"12345\", not 8 hex digits");
  with_sums(R"({"x":305419896})");
  expect("the checksum of tensor 'x' in __metadata__ 'vqddp.crc32c' is 305419896, not 8 hex digits");
}

TEST_CASE("a file without checksums (another writer's) loads unverified and says so") {
  TempDir dir;
  std::string p = dir.file("plain.safetensors");
  write_raw(p, R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "abcd");
  SafetensorsFile f = safetensors_load(p);
  CHECK_FALSE(f.checksummed);
  CHECK(f.at("x").numel() == 1);
}

namespace {

std::vector<std::string> files_in(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("a killed save's temporary is removed at the next start; a live writer's and other files are kept") {
  TempDir dir;
  std::string target = dir.file("checkpoint.safetensors");
  std::string dead = fmt::format("checkpoint.safetensors.tmp.{}.0123abcd", dead_pid());
  std::string live = fmt::format("checkpoint.safetensors.tmp.{}.89abcdef", getppid());  // our parent runs
  std::string mine = fmt::format("checkpoint.safetensors.tmp.{}.00000000", getpid());   // an earlier same-pid process's
  std::vector<std::string> kept = {
      "checkpoint.safetensors", live,
      fmt::format("other.safetensors.tmp.{}.0123abcd", dead_pid()),  // another target's
      "checkpoint.safetensors.tmp.12x.0123abcd",                      // not write_file_atomic's names
      "checkpoint.safetensors.tmp.1.0123abc"};
  for (const std::string& name : kept) std::ofstream(dir.file(name)) << "x";
  std::ofstream(dir.file(dead)) << "partial";
  std::ofstream(dir.file(mine)) << "partial";
  std::vector<std::string> removed = remove_stale_temporaries(target);
  std::sort(removed.begin(), removed.end());
  std::vector<std::string> want = {dir.file(dead), dir.file(mine)};
  std::sort(want.begin(), want.end());
  CHECK(removed == want);
  std::sort(kept.begin(), kept.end());
  CHECK(files_in(dir.path()) == kept);
  // A directory that does not exist yet holds nothing to remove.
  CHECK(remove_stale_temporaries(dir.file("new/checkpoint.safetensors")).empty());
}
