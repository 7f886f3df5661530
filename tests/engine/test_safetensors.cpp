// safetensors round trip, and every malformed-file case named in the error.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "engine/file_io.h"
#include "engine/safetensors.h"
#include "tests/engine/tmpdir.h"

using namespace vqddp;
using vqddp::test::TempDir;

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
    expect("needs");
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
                       doctest::Contains("cannot create temporary file"), Error);
  CHECK(read_file(path) == before);
}
