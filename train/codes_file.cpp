#include "train/codes_file.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/core/json_strict.h"
#include "engine/core/parse_number.h"
#include "engine/core/safetensors.h"

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
  c.codes.resize(static_cast<size_t>(rows * c.layers));
  const auto* p = reinterpret_cast<const unsigned char*>(packed.data());
  int64_t at = 0;  // bit position
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t l = 0; l < c.layers; ++l) {
      int64_t v = 0;
      for (int64_t b = 0; b < bits[l]; ++b, ++at) v |= int64_t{(p[at >> 3] >> (at & 7)) & 1} << b;
      VQDDP_CHECK(v < c.codebook_sizes[l], "{}: code {} of layer {} in row {} is outside its codebook of {}", f.path,
                  v, l, r, c.codebook_sizes[l]);
      c.codes[static_cast<size_t>(r * c.layers + l)] = v;
    }
  for (; at < static_cast<int64_t>(packed.size()) * 8; ++at)
    VQDDP_CHECK(((p[at >> 3] >> (at & 7)) & 1) == 0, "{}: the padding bits after the last code are not zero", f.path);
}

}  // namespace

int code_bits(int64_t size) {
  int b = 0;
  while ((int64_t{1} << b) < size) ++b;
  return b;
}

void write_codes_file(const std::string& path, const CodesFile& c) {
  const int64_t layers = static_cast<int64_t>(c.codebook_sizes.size());
  VQDDP_CHECK(layers == c.layers && layers > 0 && c.samples > 0 && c.frame > 0 && c.tokens > 0,
              "{}: a codes file of {} samples, {} layers ({} sizes)", path, c.samples, c.layers, layers);
  const int64_t rows = c.frames() * c.tokens;
  VQDDP_CHECK(rows <= kMaxCodes / layers && static_cast<int64_t>(c.codes.size()) == rows * layers,
              "{}: {} codes for {} rows of {} layers (at most {} codes a file)", path, c.codes.size(), rows, layers,
              kMaxCodes);
  std::vector<int64_t> bits;
  int64_t row_bits = 0;
  for (int64_t k : c.codebook_sizes) {
    bits.push_back(code_bits(k));
    row_bits += bits.back();
  }
  VQDDP_CHECK(row_bits > 0, "{}: every layer's codebook holds one code: its codes carry no bits", path);
  std::string packed(static_cast<size_t>((rows * row_bits + 7) / 8), '\0');
  int64_t at = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t l = 0; l < layers; ++l) {
      const int64_t v = c.codes[static_cast<size_t>(r * layers + l)];
      VQDDP_CHECK(v >= 0 && v < c.codebook_sizes[l], "{}: code {} of layer {} in row {} is outside its codebook of {}",
                  path, v, l, r, c.codebook_sizes[l]);
      for (int64_t b = 0; b < bits[l]; ++b, ++at)
        packed[static_cast<size_t>(at >> 3)] |= static_cast<char>(((v >> b) & 1) << (at & 7));
    }
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

CodesFile read_codes_file(const std::string& path) {
  SafetensorsFile f = safetensors_load(path);
  const std::string format = text_of(f, "format");
  CodesFile c;
  if (format == kFormat2) {
    read_format2(f, c);
  } else if (format == kFormat1) {
    read_format1(f, c);
  } else {
    VQDDP_THROW("{}: not a vqddp codes file (format '{}'; `vqddp encode` writes {}, and {} from older vqddp is read "
                "too)", path, format, kFormat2, kFormat1);
  }
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
  return static_cast<double>(row_bits * c.rows()) / c.seconds();
}

}  // namespace vqddp
