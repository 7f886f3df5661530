#include "train/codes_file.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>

#include "engine/core/error.h"
#include "engine/core/file_io.h"
#include "engine/core/json_strict.h"
#include "engine/core/output_file.h"
#include "engine/core/parse_number.h"
#include "engine/core/safetensors.h"
#include "train/range_coder.h"

namespace vqddp {

namespace {

constexpr const char* kFormat1 = "vqddp-codes/1";
constexpr const char* kFormat2 = "vqddp-codes/2";

int64_t count_of(const SafetensorsFile& f, const char* key) {
  auto it = f.metadata.find(key);
  VQDDP_CHECK(it != f.metadata.end(), "{}: not a complete codes file: __metadata__ has no '{}'", f.path, key);
  std::optional<int64_t> v = parse_int(it->second);
  VQDDP_CHECK(v && *v >= 0, "{}: __metadata__ '{}' is '{}', not a count", f.path, key, it->second);
  return *v;
}

std::string text_of(const SafetensorsFile& f, const char* key) {
  auto it = f.metadata.find(key);
  return it == f.metadata.end() ? std::string() : it->second;
}

std::vector<int64_t> counts_of(const SafetensorsFile& f, const char* key) {
  nlohmann::json j = parse_json_strict(text_of(f, key), fmt::format("{}: __metadata__ '{}'", f.path, key));
  VQDDP_CHECK(j.is_array(), "{}: __metadata__ '{}' is not a JSON array", f.path, key);
  std::vector<int64_t> out;
  for (const nlohmann::json& v : j) {
    VQDDP_CHECK(v.is_number_unsigned() && v.get<uint64_t>() <= (uint64_t{1} << 40), "{}: __metadata__ '{}' holds {}, "
                "not a count", f.path, key, v.dump());
    out.push_back(v.get<int64_t>());
  }
  return out;
}

// The metadata both formats share, and the rows it implies checked
// against `rows` (bounded first, so nothing below overflows).
void read_common(const SafetensorsFile& f, CodesFile& c) {
  c.sample_rate = count_of(f, "sample_rate");
  c.samples = count_of(f, "samples");
  c.frame = count_of(f, "frame");
  c.tokens = count_of(f, "tokens");
  c.layers = count_of(f, "layers");
  c.checkpoint_step = count_of(f, "checkpoint_step");
  c.codec_fingerprint = text_of(f, "codec_fingerprint");
  c.source = text_of(f, "source");
  VQDDP_CHECK(c.sample_rate > 0 && c.frame > 0 && c.tokens > 0 && c.layers > 0 && c.samples > 0,
              "{}: __metadata__ says sample_rate {}, frame {}, tokens {}, layers {}, samples {}: each must be positive",
              f.path, c.sample_rate, c.frame, c.tokens, c.layers, c.samples);
  VQDDP_CHECK(c.frame <= (int64_t{1} << 30) && c.tokens <= (int64_t{1} << 20) && c.layers <= 4096 &&
                  c.samples <= (int64_t{1} << 40), "{}: __metadata__ frame {}, tokens {}, layers {}, samples {}: "
              "beyond what a codes file can hold", f.path, c.frame, c.tokens, c.layers, c.samples);
}

void read_format1(const SafetensorsFile& f, CodesFile& c) {
  c.format = 1;
  VQDDP_CHECK(f.checksummed, "{}: a codes file must carry checksums but its __metadata__ has none: the header is "
              "damaged", f.path);
  read_common(f, c);
  const Tensor& codes = f.at("codes");
  VQDDP_CHECK(codes.dim() == 2 && codes.dtype() == DType::i64 && codes.size(0) == c.frames() * c.tokens &&
                  codes.size(1) == c.layers,
              "{}: tensor 'codes' is {}; {} samples in frames of {} need int64 [{} frames x {} tokens, {} layers]",
              f.path, codes.desc(), c.samples, c.frame, c.frames(), c.tokens, c.layers);
  c.codes = codes.to_vector<int64_t>();
}

void read_format2(const SafetensorsFile& f, CodesFile& c) {
  c.format = 2;
  VQDDP_CHECK(f.checksummed && f.metadata_checksummed, "{}: a codes file must carry checksums of its codes and its "
              "metadata, and this one has {}: the header is damaged or was edited", f.path,
              f.checksummed ? "none of its metadata" : "none of its codes");
  c.metadata_checked = true;
  read_common(f, c);
  c.codebook_sizes = counts_of(f, "codebook_sizes");
  const std::vector<int64_t> bits = counts_of(f, "bits");
  VQDDP_CHECK(static_cast<int64_t>(c.codebook_sizes.size()) == c.layers && bits.size() == c.codebook_sizes.size(),
              "{}: __metadata__ has {} codebook sizes and {} widths for {} layers", f.path, c.codebook_sizes.size(),
              bits.size(), c.layers);
  int64_t row_bits = 0;
  for (size_t l = 0; l < bits.size(); ++l) {
    VQDDP_CHECK(c.codebook_sizes[l] >= 1 && bits[l] == code_bits(c.codebook_sizes[l]), "{}: layer {}: {} bits for a "
                "codebook of {} (ceil(log2 K) is {})", f.path, l, bits[l], c.codebook_sizes[l],
                code_bits(std::max<int64_t>(c.codebook_sizes[l], 1)));
    row_bits += bits[l];
  }
  VQDDP_CHECK(f.tensors.empty() && f.bytes.size() == 1 && f.bytes[0].first == "codes", "{}: a codes file holds one "
              "tensor, 'codes' (U8)", f.path);
  const std::string& packed = f.bytes[0].second;
  // rows (< 2^60) times row_bits or layers could overflow int64, and a
  // crafted header could ask for any number of codes: bound rows by what
  // the payload holds and the codes by kMaxCodes before any product.
  const int64_t rows = c.frames() * c.tokens, payload_bits = static_cast<int64_t>(packed.size()) * 8;
  VQDDP_CHECK(row_bits > 0, "{}: every layer's codebook holds one code: its codes carry no bits", f.path);
  VQDDP_CHECK(rows <= (payload_bits + 7) / row_bits, "{}: tensor 'codes' has {} bytes, far too few for {} samples in "
              "frames of {} ({} rows of {} bits)", f.path, packed.size(), c.samples, c.frame, rows, row_bits);
  VQDDP_CHECK(rows <= kMaxCodes / c.layers, "{}: {} rows of {} layers are more codes than a codes file may hold ({})",
              f.path, rows, c.layers, kMaxCodes);
  const int64_t total_bits = rows * row_bits;
  VQDDP_CHECK(static_cast<int64_t>(packed.size()) == (total_bits + 7) / 8, "{}: tensor 'codes' has {} bytes; {} "
              "samples in frames of {} are {} rows of {} bits: {} bytes", f.path, packed.size(), c.samples, c.frame,
              rows, row_bits, (total_bits + 7) / 8);
  const bool padding_zero =
      unpack_codes(reinterpret_cast<const unsigned char*>(packed.data()), rows, c.codebook_sizes, c.codes);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t l = 0; l < c.layers; ++l) {
      const int64_t v = c.codes[static_cast<size_t>(r * c.layers + l)];
      VQDDP_CHECK(v < c.codebook_sizes[l], "{}: code {} of layer {} in row {} is outside its codebook of {}", f.path,
                  v, l, r, c.codebook_sizes[l]);
    }
  VQDDP_CHECK(padding_zero, "{}: the padding bits after the last code are not zero", f.path);
}

}  // namespace

int code_bits(int64_t size) {
  int b = 0;
  while ((int64_t{1} << b) < size) ++b;
  return b;
}

namespace {
int64_t row_bits_of(const std::vector<int64_t>& sizes) {
  int64_t bits = 0;
  for (int64_t k : sizes) bits += code_bits(k);
  return bits;
}
}  // namespace

int64_t packed_codes_bytes(int64_t rows, const std::vector<int64_t>& sizes) {
  return (rows * row_bits_of(sizes) + 7) / 8;
}

std::string pack_codes(const int64_t* codes, int64_t rows, const std::vector<int64_t>& sizes) {
  const int64_t layers = static_cast<int64_t>(sizes.size());
  std::string packed(static_cast<size_t>(packed_codes_bytes(rows, sizes)), '\0');
  int64_t at = 0;  // bit position
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t l = 0; l < layers; ++l) {
      const int64_t v = codes[r * layers + l];
      for (int b = 0; b < code_bits(sizes[l]); ++b, ++at)
        packed[static_cast<size_t>(at >> 3)] |= static_cast<char>(((v >> b) & 1) << (at & 7));
    }
  return packed;
}

bool unpack_codes(const unsigned char* bytes, int64_t rows, const std::vector<int64_t>& sizes,
                  std::vector<int64_t>& codes) {
  const int64_t layers = static_cast<int64_t>(sizes.size()), total = rows * row_bits_of(sizes);
  codes.assign(static_cast<size_t>(rows * layers), 0);
  int64_t at = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t l = 0; l < layers; ++l) {
      int64_t v = 0;
      for (int b = 0; b < code_bits(sizes[l]); ++b, ++at) v |= int64_t{(bytes[at >> 3] >> (at & 7)) & 1} << b;
      codes[static_cast<size_t>(r * layers + l)] = v;
    }
  for (; at < (total + 7) / 8 * 8; ++at)
    if ((bytes[at >> 3] >> (at & 7)) & 1) return false;
  return true;
}

void write_codes_file_format2(const std::string& path, const CodesFile& c) {
  const int64_t layers = static_cast<int64_t>(c.codebook_sizes.size());
  VQDDP_CHECK(layers == c.layers && layers > 0 && c.samples > 0 && c.frame > 0 && c.tokens > 0,
              "{}: a codes file of {} samples, {} layers ({} sizes)", path, c.samples, c.layers, layers);
  const int64_t rows = c.frames() * c.tokens;
  VQDDP_CHECK(rows <= kMaxCodes / layers && static_cast<int64_t>(c.codes.size()) == rows * layers,
              "{}: {} codes for {} rows of {} layers (at most {} codes a file)", path, c.codes.size(), rows, layers,
              kMaxCodes);
  VQDDP_CHECK(row_bits_of(c.codebook_sizes) > 0, "{}: every layer's codebook holds one code: its codes carry no "
              "bits", path);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t l = 0; l < layers; ++l) {
      const int64_t v = c.codes[static_cast<size_t>(r * layers + l)];
      VQDDP_CHECK(v >= 0 && v < c.codebook_sizes[l], "{}: code {} of layer {} in row {} is outside its codebook of {}",
                  path, v, l, r, c.codebook_sizes[l]);
    }
  const std::string packed = pack_codes(c.codes.data(), rows, c.codebook_sizes);
  std::vector<int64_t> bits;
  for (int64_t k : c.codebook_sizes) bits.push_back(code_bits(k));
  safetensors_save(path, {},
                   {{"format", kFormat2},
                    {"sample_rate", std::to_string(c.sample_rate)},
                    {"samples", std::to_string(c.samples)},
                    {"frame", std::to_string(c.frame)},
                    {"tokens", std::to_string(c.tokens)},
                    {"layers", std::to_string(layers)},
                    {"codebook_sizes", nlohmann::json(c.codebook_sizes).dump()},
                    {"bits", nlohmann::json(bits).dump()},
                    {"codec_fingerprint", c.codec_fingerprint},
                    {"checkpoint_step", std::to_string(c.checkpoint_step)},
                    {"source", c.source}},
                   {{"codes", packed}});
}

// ---- the code model ----

CodeModel CodeModel::from_counts(const std::vector<int64_t>& sizes, const std::vector<std::vector<double>>& counts) {
  VQDDP_CHECK(counts.size() == sizes.size(), "code model: {} count lists for {} layers", counts.size(), sizes.size());
  CodeModel m;
  for (size_t l = 0; l < sizes.size(); ++l) {
    const int64_t k = sizes[l];
    VQDDP_CHECK(k >= 1, "code model: layer {} has a codebook of {}", l, k);
    m.sizes_.push_back(k);
    if (k > static_cast<int64_t>(kTotal)) {  // raw bits
      m.freqs_.emplace_back();
      m.counted_.push_back(false);
      continue;
    }
    std::vector<double> w = counts[l];
    VQDDP_CHECK(w.empty() || static_cast<int64_t>(w.size()) == k, "code model: layer {}: {} counts for {} codes", l,
                w.size(), k);
    double sum = 0;
    for (double& x : w) {
      if (!std::isfinite(x) || x < 0) x = 0;
      sum += x;
    }
    const bool counted = !w.empty() && sum > 0 && std::isfinite(sum);
    if (!counted) w.assign(static_cast<size_t>(k), 1.0), sum = static_cast<double>(k);
    // Each code 1, and the rest of the total shared in proportion to the
    // counts: the floors first, then one more to the largest remainders
    // (ties: the lower code), so the table sums to 2^16 exactly.
    const double spare = static_cast<double>(kTotal - static_cast<uint32_t>(k));
    std::vector<uint32_t> f(static_cast<size_t>(k));
    std::vector<double> rest(static_cast<size_t>(k));
    uint32_t given = 0;
    for (size_t s = 0; s < f.size(); ++s) {
      const double share = w[s] / sum * spare, base = std::floor(share);
      f[s] = 1 + static_cast<uint32_t>(base);
      rest[s] = share - base;
      given += f[s];
    }
    std::vector<size_t> order(f.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return rest[a] > rest[b]; });
    for (size_t i = 0; given < kTotal; i = (i + 1) % order.size(), ++given) ++f[order[i]];
    m.freqs_.push_back(std::move(f));
    m.counted_.push_back(counted);
  }
  return m;
}

CodeModel CodeModel::uniform(const std::vector<int64_t>& sizes) {
  return from_counts(sizes, std::vector<std::vector<double>>(sizes.size()));
}

double CodeModel::cost(int64_t l, int64_t code) const {
  const std::vector<uint32_t>& f = frequencies(l);
  if (f.empty()) return code_bits(size(l));
  return -std::log2(static_cast<double>(f[static_cast<size_t>(code)]) / kTotal);
}

namespace {

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_varint(std::string& out, uint64_t v) {
  do {
    const auto byte = static_cast<uint8_t>(v & 0x7f);
    v >>= 7;
    out.push_back(static_cast<char>(byte | (v ? 0x80 : 0)));
  } while (v);
}

}  // namespace

uint32_t CodeModel::crc(int64_t layers) const {
  std::string b;
  for (int64_t l = 0; l < layers; ++l) {
    put_varint(b, static_cast<uint64_t>(size(l)));
    for (uint32_t f : frequencies(l)) put_u32(b, f);
  }
  return crc32c(b.data(), b.size());
}

// ---- format 3 ----

namespace {

constexpr char kMagic[4] = {'V', 'Q', 'D', 'C'};
constexpr uint8_t kVersion = 3;
constexpr int64_t kMaxHeaderBytes = 1 << 16;  // 4096 layers' sizes and a 4096-byte name fit
constexpr int64_t kMaxSource = 4096;

// Bounds-checked reading of a header or a chunk's length: what runs past
// the bytes, or is not a varint, is refused naming the file and the field.
struct Cursor {
  const std::string& path;
  const unsigned char* p;
  int64_t size, at = 0;

  uint8_t byte(const char* what) {
    VQDDP_CHECK(at < size, "{}: truncated: the file ends inside the header's {} (byte {})", path, what, at);
    return p[at++];
  }
  uint64_t varint(const char* what) {
    uint64_t v = 0;
    for (int i = 0;; ++i) {
      VQDDP_CHECK(i < 10, "{}: the header's {} is not a varint (more than 10 bytes)", path, what);
      const uint8_t b = byte(what);
      VQDDP_CHECK(i < 9 || b <= 1, "{}: the header's {} is not a varint (past 64 bits)", path, what);
      VQDDP_CHECK(b != 0 || i == 0, "{}: the header's {} is not a varint (a redundant zero byte)", path, what);
      v |= static_cast<uint64_t>(b & 0x7f) << (7 * i);
      if (!(b & 0x80)) return v;
    }
  }
  int64_t count(const char* what, int64_t max) {
    const uint64_t v = varint(what);
    VQDDP_CHECK(v <= static_cast<uint64_t>(max), "{}: the header's {} is {}, beyond what a codes file holds ({})",
                path, what, v, max);
    return static_cast<int64_t>(v);
  }
  uint32_t u32(const char* what) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(byte(what)) << (8 * i);
    return v;
  }
};

// A chunk's CRC before its payload: the header CRC, then the chunk number.
uint32_t chunk_crc_seed(uint32_t header_crc, int64_t index) {
  std::string n;
  put_u32(n, static_cast<uint32_t>(index));
  return crc32c(n.data(), n.size(), header_crc);
}

uint32_t chunk_crc(uint32_t header_crc, int64_t index, const std::string& payload) {
  return crc32c(payload.data(), payload.size(), chunk_crc_seed(header_crc, index));
}

std::vector<FrequencyTable> tables_of(const CodeModel& model, int64_t layers) {
  std::vector<FrequencyTable> t;
  for (int64_t l = 0; l < layers; ++l)
    t.push_back(model.frequencies(l).empty() ? FrequencyTable() : FrequencyTable(model.frequencies(l)));
  return t;
}

// The common checks of the shape: positive, bounded, codes that carry bits.
void check_shape(const CodesFile& c, const std::string& path, const char* where) {
  VQDDP_CHECK(c.sample_rate > 0 && c.frame > 0 && c.tokens > 0 && c.layers > 0 && c.samples > 0 && c.chunk_frames > 0,
              "{}: {} says sample_rate {}, frame {}, tokens {}, layers {}, samples {}, chunk frames {}: each must be "
              "positive", path, where, c.sample_rate, c.frame, c.tokens, c.layers, c.samples, c.chunk_frames);
  int64_t row_bits = 0;
  for (int64_t k : c.codebook_sizes) {
    VQDDP_CHECK(k >= 1, "{}: {} says a codebook of {}", path, where, k);
    row_bits += code_bits(k);
  }
  VQDDP_CHECK(row_bits > 0, "{}: every layer's codebook holds one code: its codes carry no bits", path);
  VQDDP_CHECK(c.frames() * c.tokens <= kMaxCodes / c.layers, "{}: {} rows of {} layers are more codes than a codes "
              "file may hold ({})", path, c.frames() * c.tokens, c.layers, kMaxCodes);
}

uint32_t fingerprint_value(const std::string& path, const std::string& hex) {
  VQDDP_CHECK(hex.size() == 8 && hex.find_first_not_of("0123456789abcdef") == std::string::npos, "{}: codec "
              "fingerprint '{}' is not 8 hex digits", path, hex);
  return static_cast<uint32_t>(std::stoul(hex, nullptr, 16));
}

}  // namespace

std::string codes_file_bytes(const CodesFile& c, const CodeModel& model) {
  const std::string path = c.source.empty() ? std::string("codes file") : c.source;  // for messages
  const int64_t layers = static_cast<int64_t>(c.codebook_sizes.size());
  VQDDP_CHECK(layers == c.layers && layers > 0 && layers <= 4096, "{}: a codes file of {} layers ({} sizes)", path,
              c.layers, layers);
  check_shape(c, path, "the codes");
  const int64_t rows = c.frames() * c.tokens;
  VQDDP_CHECK(static_cast<int64_t>(c.codes.size()) == rows * layers, "{}: {} codes for {} rows of {} layers", path,
              c.codes.size(), rows, layers);
  VQDDP_CHECK(model.layers() >= layers, "{}: {} layers, but the code model has {}", path, layers, model.layers());
  for (int64_t l = 0; l < layers; ++l)
    VQDDP_CHECK(model.size(l) == c.codebook_sizes[l], "{}: layer {} has a codebook of {}, its code model's table {}",
                path, l, c.codebook_sizes[l], model.size(l));
  VQDDP_CHECK(static_cast<int64_t>(c.source.size()) <= kMaxSource, "{}: a source name of {} bytes (at most {})", path,
              c.source.size(), kMaxSource);
  std::string out(kMagic, 4);
  out.push_back(static_cast<char>(kVersion));
  for (int64_t v : {c.sample_rate, c.samples, c.frame, c.tokens, c.layers}) put_varint(out, static_cast<uint64_t>(v));
  for (int64_t k : c.codebook_sizes) put_varint(out, static_cast<uint64_t>(k));
  put_u32(out, fingerprint_value(path, c.codec_fingerprint));
  put_varint(out, static_cast<uint64_t>(std::max<int64_t>(c.checkpoint_step, 0)));
  put_u32(out, model.crc(layers));
  put_varint(out, static_cast<uint64_t>(c.chunk_frames));
  put_varint(out, c.source.size());
  out += c.source;
  const uint32_t header_crc = crc32c(out.data(), out.size());
  put_u32(out, header_crc);
  const std::vector<FrequencyTable> tables = tables_of(model, layers);
  const int64_t frames = c.frames();
  for (int64_t index = 0, first = 0; first < frames; ++index, first += c.chunk_frames) {
    const int64_t end = std::min(frames, first + c.chunk_frames);
    RangeEncoder enc;
    for (int64_t r = first * c.tokens; r < end * c.tokens; ++r)
      for (int64_t l = 0; l < layers; ++l) {
        const int64_t v = c.codes[static_cast<size_t>(r * layers + l)];
        VQDDP_CHECK(v >= 0 && v < c.codebook_sizes[l], "{}: code {} of layer {} in row {} is outside its codebook of "
                    "{}", path, v, l, r, c.codebook_sizes[l]);
        if (tables[l].size() > 0) {
          enc.encode(tables[l], static_cast<uint32_t>(v));
        } else {
          const int bits = code_bits(c.codebook_sizes[l]);
          for (int b = 0; b < bits; b += 16)
            enc.encode_bits(static_cast<uint32_t>((v >> b) & ((int64_t{1} << std::min(16, bits - b)) - 1)),
                            std::min(16, bits - b));
        }
      }
    const std::string payload = enc.finish();
    put_varint(out, payload.size());
    put_u32(out, chunk_crc(header_crc, index, payload));
    out += payload;
  }
  return out;
}

void write_codes_file(const std::string& path, const CodesFile& c, const CodeModel& model) {
  const std::string bytes = codes_file_bytes(c, model);
  OutputFile f(path);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

bool is_codes_file_format3(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char m[4] = {};
  return in.read(m, 4) && std::equal(m, m + 4, kMagic);
}

CodesReader::CodesReader(const std::string& path) : path_(path), in_(path, std::ios::binary) {
  VQDDP_CHECK(in_, "{}: cannot open", path);
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  VQDDP_CHECK(!ec, "{}: cannot read its size: {}", path, ec.message());
  c_.file_bytes = static_cast<int64_t>(size);
  std::string head(static_cast<size_t>(std::min<int64_t>(c_.file_bytes, kMaxHeaderBytes)), '\0');
  in_.read(head.data(), static_cast<std::streamsize>(head.size()));
  VQDDP_CHECK(in_.gcount() == static_cast<std::streamsize>(head.size()), "{}: cannot read its header", path);
  Cursor h{path, reinterpret_cast<const unsigned char*>(head.data()), static_cast<int64_t>(head.size())};
  VQDDP_CHECK(head.size() >= 4 && std::equal(head.begin(), head.begin() + 4, kMagic), "{}: not a vqddp codes file "
              "(no \"VQDC\" at its start)", path);
  h.at = 4;
  const uint8_t version = h.byte("version");
  VQDDP_CHECK(version == kVersion, "{}: a codes file of format {}, which this vqddp does not read (it reads 1, 2 and "
              "3)", path, version);
  c_.format = 3;
  c_.sample_rate = h.count("sample rate", int64_t{1} << 31);
  c_.samples = h.count("samples", int64_t{1} << 40);
  c_.frame = h.count("frame", int64_t{1} << 30);
  c_.tokens = h.count("tokens", int64_t{1} << 20);
  c_.layers = h.count("layers", 4096);
  for (int64_t l = 0; l < c_.layers; ++l) c_.codebook_sizes.push_back(h.count("codebook size", int64_t{1} << 40));
  c_.codec_fingerprint = fmt::format("{:08x}", h.u32("codec fingerprint"));
  c_.checkpoint_step = h.count("checkpoint step", int64_t{1} << 62);
  c_.code_model_crc = h.u32("code model CRC");
  c_.chunk_frames = h.count("chunk frames", int64_t{1} << 30);
  const int64_t source = h.count("source name's length", kMaxSource);
  VQDDP_CHECK(h.at + source <= h.size, "{}: truncated: the file ends inside the header's source name", path);
  c_.source.assign(head.data() + h.at, static_cast<size_t>(source));
  h.at += source;
  const int64_t covered = h.at;
  header_crc_ = crc32c(head.data(), static_cast<size_t>(covered));
  const uint32_t stored = h.u32("CRC");
  VQDDP_CHECK(stored == header_crc_, "{}: the header is damaged or was edited (its CRC32C is {:08x}, the file says "
              "{:08x})", path, header_crc_, stored);
  c_.metadata_checked = true;
  check_shape(c_, path, "the header");
  // Each chunk takes 5 bytes at least (a length and a CRC).
  at_ = first_chunk_at_ = h.at;
  const int64_t left = c_.file_bytes - at_;
  VQDDP_CHECK(c_.chunks() <= left / 5, "{}: the header promises {} chunks ({} frames in chunks of {}), but the {} "
              "bytes after it hold {} at most: the file is truncated or the header was crafted", path, c_.chunks(),
              c_.frames(), c_.chunk_frames, left, left / 5);
  in_.clear();
  in_.seekg(at_);
}

std::vector<DamagedChunk> damaged_chunks(const std::string& path) {
  CodesReader reader(path);
  CodesReader::Chunk k;
  std::vector<DamagedChunk> out;
  while (reader.next(k))
    if (k.damaged) out.push_back({k.why, reader.describe(k.index)});
  return out;
}

std::string CodesReader::describe(int64_t index) const {
  const int64_t first = index * c_.chunk_frames, end = std::min(c_.frames(), first + c_.chunk_frames);
  const double sec = static_cast<double>(c_.frame) / static_cast<double>(c_.sample_rate);
  return fmt::format("chunk {} of {} (frames {}-{}, {:.2f}-{:.2f} s)", index + 1, c_.chunks(), first, end - 1,
                     static_cast<double>(first) * sec,
                     std::min(static_cast<double>(end) * sec, c_.seconds()));
}

namespace {

// A varint length at text[at..], at most 10 bytes; false if it does not end
// inside `size` or overflows. `at` moves past it.
bool read_length(const unsigned char* text, int64_t size, int64_t& at, uint64_t& length) {
  length = 0;
  for (int i = 0; i < 10 && at < size; ++i) {
    const int b = text[at++];
    length |= static_cast<uint64_t>(b & 0x7f) << (7 * i);
    if (!(b & 0x80)) return i < 9 || b <= 1;
  }
  return false;
}

}  // namespace

int64_t CodesReader::find_chunk(int64_t from, int64_t index, int64_t first_try) {
  // Where chunk `index` can start: within four mean chunks of `from` (its
  // damaged predecessor's start), so a search costs about a chunk's bytes
  // per candidate offset, not the file's.
  const int64_t mean = (c_.file_bytes - first_chunk_at_) / std::max<int64_t>(c_.chunks(), 1);
  const int64_t window = 4 * mean + 64;
  const int64_t end = std::min(c_.file_bytes, from + 2 * window + 14);
  std::string text(static_cast<size_t>(end - from), '\0');
  in_.clear();
  in_.seekg(from);
  in_.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (!in_) return -1;
  const auto* t = reinterpret_cast<const unsigned char*>(text.data());
  const int64_t size = static_cast<int64_t>(text.size());
  const uint32_t seed = chunk_crc_seed(header_crc_, index);  // the payload's CRC continues from it
  auto chunk_at = [&](int64_t q) {
    int64_t at = q;
    uint64_t length = 0;
    if (!read_length(t, size, at, length) || size - at < 4 || length > static_cast<uint64_t>(size - at - 4))
      return false;  // (size - at < 4 first: a length near the end must not wrap the bound below)
    uint32_t stored = 0;
    for (int i = 0; i < 4; ++i) stored |= static_cast<uint32_t>(t[at + i]) << (8 * i);
    return crc32c(text.data() + at + 4, static_cast<size_t>(length), seed) == stored;
  };
  // Where the damaged chunk's length says first: a damaged payload is the
  // likelier damage, and one check instead of a search.
  if (first_try > from && first_try - from < size && chunk_at(first_try - from)) return first_try;
  for (int64_t q = 1; q < std::min(size, window); ++q)
    if (chunk_at(q)) return from + q;
  return -1;
}

bool CodesReader::next(Chunk& k) {
  if (next_index_ >= c_.chunks()) {
    VQDDP_CHECK(lost_ || at_ == c_.file_bytes, "{}: {} bytes after the last chunk: the file was appended to or "
                "damaged", path_, c_.file_bytes - at_);
    return false;
  }
  k = Chunk{};
  k.index = next_index_++;
  k.first_frame = k.index * c_.chunk_frames;
  k.frames = std::min(c_.frames(), k.first_frame + c_.chunk_frames) - k.first_frame;
  const int64_t start = k.offset = at_;
  // A damaged chunk: its length may be what was damaged, so the next chunk
  // is searched for byte by byte from this one's start: its CRC covers its
  // number, so the first match is that chunk (where this one's length says
  // when only the payload was damaged). Not found (the next one is
  // damaged too): the rest is lost, each chunk named.
  auto damaged = [&](const std::string& why) {
    k.damaged = true;
    k.why = fmt::format("{}: {} is damaged: {}", path_, describe(k.index), why);
    if (lost_) return true;
    // The last chunk: what follows it, if anything, is its own damage.
    const int64_t found = next_index_ < c_.chunks() ? find_chunk(start, next_index_, at_) : -1;
    if (found < 0) {
      lost_ = true;
    } else {
      at_ = found;
      in_.clear();
      in_.seekg(at_);
    }
    return true;
  };
  if (lost_) return damaged("a damaged chunk before it could not be told from the next, so it cannot be found");
  // The length: a varint of at most 10 bytes, inside the file.
  unsigned char head[10];
  const int64_t have = std::min<int64_t>(10, c_.file_bytes - at_);
  in_.read(reinterpret_cast<char*>(head), have);
  VQDDP_CHECK(in_, "{}: cannot read {}", path_, describe(k.index));
  int64_t used = 0;
  uint64_t length = 0;
  const bool ok = read_length(head, have, used, length);
  at_ += used;
  in_.clear();
  in_.seekg(at_);
  const int64_t left = c_.file_bytes - at_;
  if (!ok || left < 4 || length > static_cast<uint64_t>(left - 4)) {
    return damaged(ok ? fmt::format("its length ({} bytes) runs past the end of the file ({} bytes left): the file "
                                    "is truncated or the length is damaged", length, std::max<int64_t>(left - 4, 0))
                      : "its length is not a varint inside the file: the file is truncated or damaged");
  }
  char crc[4];
  in_.read(crc, 4);
  k.payload.resize(static_cast<size_t>(length));
  in_.read(k.payload.data(), static_cast<std::streamsize>(length));
  VQDDP_CHECK(in_, "{}: cannot read {}", path_, describe(k.index));
  at_ += 4 + static_cast<int64_t>(length);
  uint32_t stored = 0;
  for (int i = 0; i < 4; ++i) stored |= static_cast<uint32_t>(static_cast<uint8_t>(crc[i])) << (8 * i);
  const uint32_t actual = chunk_crc(header_crc_, k.index, k.payload);
  if (stored != actual)
    return damaged(fmt::format("its checksum does not match (CRC32C {:08x}, the file says {:08x})", actual, stored));
  return true;
}

void check_code_model(const CodesFile& c, const CodeModel& model, const std::string& path) {
  if (c.format != 3) return;
  VQDDP_CHECK(model.layers() >= c.layers, "{}: {} layers, but the code model has {}", path, c.layers, model.layers());
  for (int64_t l = 0; l < c.layers; ++l)
    VQDDP_CHECK(model.size(l) == c.codebook_sizes[l], "{}: layer {} was coded with a codebook of {}, the code "
                "model's has {}", path, l, c.codebook_sizes[l], model.size(l));
  VQDDP_CHECK(model.crc(c.layers) == c.code_model_crc, "{}: coded under code model tables with CRC32C {:08x}, but "
              "the codec's are {:08x}: decode with the checkpoint (and vqddp) that encoded it", path,
              c.code_model_crc, model.crc(c.layers));
}

std::vector<int64_t> CodesReader::codes(const Chunk& k, const CodeModel& model) const {
  VQDDP_CHECK(!k.damaged, "{}", k.why);
  check_code_model(c_, model, path_);
  const int64_t layers = c_.layers, rows = k.frames * c_.tokens;
  // The range coder spends at least -log2 p of each code, less a few bytes
  // of the whole: a chunk whose bytes cannot hold its rows is refused before
  // any are decoded.
  double min_row_bits = 0;
  for (int64_t l = 0; l < layers; ++l) {
    const std::vector<uint32_t>& f = model.frequencies(l);
    min_row_bits += f.empty() ? code_bits(model.size(l))
                              : -std::log2(static_cast<double>(*std::max_element(f.begin(), f.end())) / kTotal);
  }
  VQDDP_CHECK(static_cast<double>(rows) * min_row_bits * (1 - 1e-9) <= static_cast<double>(k.payload.size()) * 8 + 64,
              "{}: {} holds {} bytes, too few for {} rows of {} layers under the code model", path_, describe(k.index),
              k.payload.size(), rows, layers);
  const std::vector<FrequencyTable> tables = tables_of(model, layers);
  std::vector<int64_t> out(static_cast<size_t>(rows * layers));
  RangeDecoder dec(reinterpret_cast<const unsigned char*>(k.payload.data()), k.payload.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t l = 0; l < layers; ++l) {
      int64_t v = 0;
      if (tables[l].size() > 0) {
        v = dec.decode(tables[l]);
      } else {
        const int bits = code_bits(c_.codebook_sizes[l]);
        for (int b = 0; b < bits; b += 16) v |= static_cast<int64_t>(dec.decode_bits(std::min(16, bits - b))) << b;
        VQDDP_CHECK(v < c_.codebook_sizes[l], "{}: code {} of layer {} in row {} is outside its codebook of {}",
                    path_, v, l, k.first_frame * c_.tokens + r, c_.codebook_sizes[l]);
      }
      out[static_cast<size_t>(r * layers + l)] = v;
    }
  return out;
}

CodesFile read_codes_header(const std::string& path) {
  if (is_codes_file_format3(path)) return CodesReader(path).header();
  return read_codes_file(path);
}

CodesFile read_codes_file(const std::string& path, const CodeModel* model) {
  if (is_codes_file_format3(path)) {
    CodesReader reader(path);
    CodesFile c = reader.header();
    VQDDP_CHECK(model, "{}: a format-3 codes file: its codes are entropy-coded under the codec's code model, so "
                "reading them needs the checkpoint (vqddp decode CHECKPOINT ...)", path);
    check_code_model(c, *model, path);
    CodesReader::Chunk k;
    while (reader.next(k)) {
      VQDDP_CHECK(!k.damaged, "{}", k.why);
      const std::vector<int64_t> v = reader.codes(k, *model);
      c.codes.insert(c.codes.end(), v.begin(), v.end());
    }
    return c;
  }
  SafetensorsFile f = safetensors_load(path);
  const std::string format = text_of(f, "format");
  CodesFile c;
  if (format == kFormat2) {
    read_format2(f, c);
  } else if (format == kFormat1) {
    read_format1(f, c);
  } else {
    VQDDP_THROW("{}: not a vqddp codes file (format '{}'; `vqddp encode` writes format 3, and {} and {} from older "
                "vqddp are read too)", path, format, kFormat2, kFormat1);
  }
  std::error_code ec;
  c.file_bytes = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  return c;
}


double codes_entropy_bitrate(const CodesFile& c, int64_t layers) {
  if (layers == 0) layers = c.layers;
  const int64_t rows = c.rows();
  double bits = 0;
  for (int64_t l = 0; l < layers; ++l) {
    std::map<int64_t, int64_t> counts;
    for (int64_t r = 0; r < rows; ++r) ++counts[c.codes[static_cast<size_t>(r * c.layers + l)]];
    for (const auto& [code, n] : counts) {
      const double p = static_cast<double>(n) / static_cast<double>(rows);
      bits -= static_cast<double>(n) * std::log2(p);
    }
  }
  return bits / c.seconds();
}

double codes_packed_bitrate(const CodesFile& c) {
  int64_t row_bits = 0;
  for (int64_t k : c.codebook_sizes) row_bits += code_bits(k);
  return static_cast<double>(row_bits) * static_cast<double>(c.frames() * c.tokens) / c.seconds();
}

double codes_ideal_bits(const CodesFile& c, const CodeModel& model) {
  double bits = 0;
  for (size_t i = 0; i < c.codes.size(); ++i) bits += model.cost(static_cast<int64_t>(i) % c.layers, c.codes[i]);
  return bits;
}

}  // namespace vqddp
