#include "engine/core/safetensors.h"

#include "engine/core/file_io.h"
#include "engine/core/output_file.h"
#include "engine/core/json_strict.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

namespace vqddp {

namespace {

using json = nlohmann::json;

constexpr const char* kChecksumKey = "vqddp.crc32c";
constexpr const char* kMetadataChecksumKey = "vqddp.metadata_crc32c";

// The CRC32C of the metadata without the two checksum entries: of its
// canonical JSON (keys sorted, as std::map holds them), so the writer and
// a reader that parsed it again compute it from the same bytes.
std::string metadata_checksum(const std::map<std::string, std::string>& metadata) {
  std::map<std::string, std::string> m = metadata;
  m.erase(kChecksumKey);
  m.erase(kMetadataChecksumKey);
  const std::string text = json(m).dump();
  return fmt::format("{:08x}", crc32c(text.data(), text.size()));
}
// The safetensors format's own bound on its JSON header.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Byte order: the format is little-endian; so is every machine we build for.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

const char* st_dtype(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::i64: return "I64";
    case DType::f64: return "F64";
  }
  return "?";
}

DType parse_dtype(const std::string& path, const std::string& name, const std::string& s) {
  if (s == "F32") return DType::f32;
  if (s == "I64") return DType::i64;
  if (s == "F64") return DType::f64;
  static const std::set<std::string> kKnown = {"F16", "BF16", "I8", "I16", "I32", "U8", "U16",
                                               "U32", "U64", "BOOL", "F8_E4M3", "F8_E5M2"};
  if (kKnown.count(s))
    VQDDP_THROW("{}: tensor '{}' has dtype {}, which vqddp does not load (it reads F32, F64 and I64)", path, name, s);
  VQDDP_THROW("{}: tensor '{}' has unknown dtype '{}'", path, name, s);
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
  bool bytes = false;  // a U8 tensor: loaded into SafetensorsFile::bytes, not as a Tensor
};

Entry parse_entry(const std::string& path, const std::string& name, const json& v, uint64_t data_size) {
  auto bad = [&](const std::string& what) { VQDDP_THROW("{}: tensor '{}': {}", path, name, what); };
  if (!v.is_object()) bad("header entry is not an object");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!v.contains(key)) bad(fmt::format("missing '{}'", key));
  if (!v["dtype"].is_string()) bad("'dtype' is not a string");
  const bool bytes = v["dtype"].get<std::string>() == "U8";
  Entry e{name, bytes ? DType::f32 : parse_dtype(path, name, v["dtype"].get<std::string>()), {}, 0, 0, bytes};
  if (!v["shape"].is_array()) bad("'shape' is not an array");
  for (const json& d : v["shape"]) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      bad("'shape' holds a value that is not a non-negative 64-bit integer");
    e.shape.push_back(d.get<int64_t>());
  }
  int64_t numel = 0;
  try {
    numel = shape_numel(e.shape);
  } catch (const Error&) {
    bad(fmt::format("shape {} has more elements than int64 holds", shape_str(e.shape)));
  }
  const json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    bad("'data_offsets' is not a pair of non-negative integers");
  e.begin = off[0].get<uint64_t>();
  e.end = off[1].get<uint64_t>();
  if (e.begin > e.end) bad(fmt::format("data_offsets [{}, {}] run backwards", e.begin, e.end));
  if (e.end > data_size)
    bad(fmt::format("data_offsets [{}, {}] pass the end of the data ({} bytes): file truncated?", e.begin, e.end,
                    data_size));
  uint64_t want = 0;
  const char* dtype = bytes ? "u8" : dtype_name(e.dtype);
  if (__builtin_mul_overflow(static_cast<uint64_t>(numel), bytes ? 1 : dtype_size(e.dtype), &want))
    bad(fmt::format("shape {} of {} needs more bytes than 64 bits count", shape_str(e.shape), dtype));
  if (e.end - e.begin != want)
    bad(fmt::format("shape {} of {} needs {} bytes, data_offsets give {}", shape_str(e.shape), dtype, want,
                    e.end - e.begin));
  return e;
}

// Checks every tensor's bytes against the checksum stored for it. Each
// tensor must have one and each checksum must name a tensor: a file whose
// entry lost a name would otherwise pass with that tensor unchecked.
void verify_checksums(const std::string& path, const std::string& stored, const std::vector<Entry>& entries,
                      const char* data) {
  json sums = parse_json_strict(stored, fmt::format("{}: __metadata__ '{}'", path, kChecksumKey));
  VQDDP_CHECK(sums.is_object(), "{}: __metadata__ '{}' is not a JSON object of tensor name -> checksum", path,
              kChecksumKey);
  for (const Entry& e : entries)
    VQDDP_CHECK(sums.contains(e.name), "{}: tensor '{}' has no checksum in __metadata__ '{}'", path, e.name,
                kChecksumKey);
  VQDDP_CHECK(sums.size() == entries.size(), "{}: __metadata__ '{}' holds {} checksums for {} tensors", path,
              kChecksumKey, sums.size(), entries.size());
  for (const Entry& e : entries) {
    const json& want = sums.at(e.name);
    uint32_t parsed = 0;
    const std::string text = want.is_string() ? want.get<std::string>() : want.dump();
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), parsed, 16);
    VQDDP_CHECK(want.is_string() && text.size() == 8 && ec == std::errc() && end == text.data() + text.size(),
                "{}: the checksum of tensor '{}' in __metadata__ '{}' is {}, not 8 hex digits", path, e.name,
                kChecksumKey, want.dump());
    uint32_t actual = crc32c(data + e.begin, e.end - e.begin);
    VQDDP_CHECK(actual == parsed, "{}: tensor '{}' is damaged (checksum {:08x}, stored {})", path, e.name, actual, text);
  }
}

}  // namespace

const Tensor& SafetensorsFile::at(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  std::vector<std::string> names;
  for (const auto& [n, _] : tensors) names.push_back(n);
  VQDDP_THROW("{}: no tensor '{}' (the file holds: {})", path, name, fmt::join(names, ", "));
}

bool SafetensorsFile::contains(const std::string& name) const {
  return std::any_of(tensors.begin(), tensors.end(), [&](const auto& p) { return p.first == name; });
}

SafetensorsFile safetensors_load(const std::string& path) {
  std::string bytes = read_file(path);
  VQDDP_CHECK(bytes.size() >= 8, "{}: file of {} bytes is too short for a safetensors header", path, bytes.size());
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  VQDDP_CHECK(header_len <= bytes.size() - 8, "{}: header length {} exceeds the file ({} bytes): truncated or not safetensors",
              path, header_len, bytes.size());
  VQDDP_CHECK(header_len <= kMaxHeaderBytes, "{}: header length {} is more than the {} bytes a safetensors header may have",
              path, header_len, kMaxHeaderBytes);
  // Strict: bounded nesting, and a tensor named twice is an error rather
  // than whichever came last.
  json header = parse_json_strict(bytes.substr(8, header_len), path + ": header");
  VQDDP_CHECK(header.is_object(), "{}: header is not a JSON object", path);
  uint64_t data_size = bytes.size() - 8 - header_len;

  SafetensorsFile out;
  out.path = path;
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      VQDDP_CHECK(it.value().is_object(), "{}: __metadata__ is not an object", path);
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        VQDDP_CHECK(m.value().is_string(), "{}: __metadata__ value '{}' is not a string", path, m.key());
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(path, it.key(), it.value(), data_size));
  }
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // The format requires the data to be covered exactly: no overlap, no
  // hole, no trailing bytes (a hole or a tail means a damaged header).
  uint64_t covered = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    if (e.begin < covered)
      VQDDP_THROW("{}: tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", path, entries[i - 1].name,
                  entries[i - 1].begin, entries[i - 1].end, e.name, e.begin, e.end);
    VQDDP_CHECK(e.begin == covered, "{}: bytes [{}, {}] of the data belong to no tensor", path, covered, e.begin);
    covered = e.end;
  }
  VQDDP_CHECK(covered == data_size, "{}: {} bytes after the last tensor belong to no tensor", path, data_size - covered);
  const char* data = bytes.data() + 8 + header_len;
  if (auto sums = out.metadata.find(kChecksumKey); sums != out.metadata.end()) {
    verify_checksums(path, sums->second, entries, data);
    out.metadata.erase(sums);
    out.checksummed = true;
  }
  if (auto sum = out.metadata.find(kMetadataChecksumKey); sum != out.metadata.end()) {
    const std::string stored = sum->second, actual = metadata_checksum(out.metadata);
    VQDDP_CHECK(stored == actual, "{}: __metadata__ is damaged or was edited (checksum {}, stored {})", path, actual,
                stored);
    out.metadata.erase(kMetadataChecksumKey);
    out.metadata_checksummed = true;
  }

  // Everything is valid: only now build tensors.
  for (const Entry& e : entries) {
    if (e.bytes) {
      out.bytes.emplace_back(e.name, std::string(data + e.begin, e.end - e.begin));
      continue;
    }
    Tensor t = empty(e.shape, e.dtype);
    std::memcpy(t.raw_data(), data + e.begin, e.end - e.begin);
    out.tensors.emplace_back(e.name, t);
  }
  return out;
}

void safetensors_save(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata, const NamedBytes& bytes) {
  for (const char* key : {kChecksumKey, kMetadataChecksumKey})
    VQDDP_CHECK(!metadata.count(key), "{}: metadata key '{}' is reserved for the checksums", path, key);
  json header = json::object(), sums = json::object();
  std::vector<Tensor> host;  // the bytes written, on the host
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    VQDDP_CHECK(name != "__metadata__" && !header.contains(name), "{}: tensor name '{}' is reserved or repeated", path, name);
    VQDDP_CHECK(t.defined(), "{}: tensor '{}' is undefined", path, name);
    host.push_back(t.device().is_cpu() ? t : t.detach().to(Device::cpu()));
    uint64_t n = host.back().nbytes();
    header[name] = {{"dtype", st_dtype(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {offset, offset + n}}};
    sums[name] = fmt::format("{:08x}", crc32c(host.back().raw_data(), n));
    offset += n;
  }
  for (const auto& [name, b] : bytes) {
    VQDDP_CHECK(name != "__metadata__" && !header.contains(name), "{}: tensor name '{}' is reserved or repeated", path, name);
    header[name] = {{"dtype", "U8"}, {"shape", {b.size()}}, {"data_offsets", {offset, offset + b.size()}}};
    sums[name] = fmt::format("{:08x}", crc32c(b.data(), b.size()));
    offset += b.size();
  }
  std::string text;
  try {
    json meta = metadata;
    meta[kChecksumKey] = sums.dump();
    meta[kMetadataChecksumKey] = metadata_checksum(metadata);
    header["__metadata__"] = meta;
    text = header.dump();
  } catch (const json::exception& e) {
    VQDDP_THROW("{}: cannot encode the header (tensor names and metadata must be UTF-8): {}", path, e.what());
  }
  // Pad with spaces so the data starts 8-byte aligned, as the format advises.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string file(8, '\0');
  uint64_t len = text.size();
  std::memcpy(file.data(), &len, 8);
  file += text;
  file.reserve(file.size() + offset);
  for (const Tensor& h : host) file.append(static_cast<const char*>(h.raw_data()), h.nbytes());
  for (const auto& [name, b] : bytes) file += b;
  write_file_atomic(path, file);
}

}  // namespace vqddp
