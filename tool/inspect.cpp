#include "tool/inspect.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/core/file_io.h"
#include "engine/core/safetensors.h"
#include "engine/core/shown.h"
#include "train/checkpoint.h"
#include "train/codes_file.h"
#include "train/config.h"
#include "vq/perplexity.h"

namespace vqddp {

std::string inspect_checkpoint(const std::string& path) {
  std::string out;
  SafetensorsFile f = read_checkpoint(path);
  nlohmann::json source = checkpoint_config(f);
  Config cfg = parse_config(source, path + " (config)");
  int64_t params = 0;
  for (const auto& [name, t] : f.tensors)
    if (name.rfind("param.", 0) == 0) params += t.numel();
  out += fmt::format("{}: step {}, {} parameters, quantizer {}, {}\n", path, checkpoint_step(f), params,
                     cfg.quantizer.type(), f.checksummed ? "checksums verified" : "no checksums (written before vqddp kept them)");
  out += fmt::format("config: {}\n", source.dump());
  const CodebookOptions* codebook = cfg.quantizer.codebook();
  float threshold = codebook ? codebook->threshold_ema_dead_code : 0.f;
  bool any = false;
  for (const auto& [name, t] : f.tensors) {
    const std::string suffix = ".cluster_size";
    if (name.size() < suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    any = true;
    const float* cs = t.data<float>();
    int64_t k = t.numel(), used = 0, dead = 0;
    for (int64_t c = 0; c < k; ++c) {
      used += cs[c] >= 1.f;
      dead += cs[c] < threshold;
    }
    std::string layer = name.substr(7, name.size() - 7 - suffix.size());  // strip "buffer." and the suffix
    out += fmt::format("  {:<32} K={:<6} used {:<6} dead {:<6} (threshold {}) perplexity {:.1f}\n", layer, k, used, dead,
               threshold, perplexity(cs, k));
  }
  if (!any) out += fmt::format("  no EMA codebooks (quantizer {} keeps no code statistics)\n", cfg.quantizer.type());
  // One line per tensor with its CRC-32C: two runs that should agree bit for
  // bit (a thread and an MPI run, a resumed and a straight one) are compared
  // with diff, whatever their metadata (step, config, backend) says.
  for (const auto& [name, t] : f.tensors)
    out += fmt::format("tensor {} {} {} crc32c {:08x}\n", name, dtype_name(t.dtype()), shape_str(t.shape()),
                       crc32c(t.raw_data(), t.nbytes()));
  return out;
}

std::string inspect_codes(const std::string& path) {
  // Format 3: the header, then each chunk's length and checksum (its codes
  // need the checkpoint's code model); formats 1 and 2: the whole file.
  const CodesFile c = read_codes_header(path);
  std::string checks = c.format == 1 ? "codes checksummed, metadata not (format 1)"
                                     : "checksums verified (codes and metadata)";
  if (c.format == 3) {
    std::vector<std::string> damaged;
    for (const DamagedChunk& d : damaged_chunks(path)) damaged.push_back(d.described);
    checks = damaged.empty() ? fmt::format("checksums verified (header and {} chunk{} of {} frames)", c.chunks(),
                                           c.chunks() == 1 ? "" : "s", c.chunk_frames)
                             : fmt::format("header verified; {} of {} chunks DAMAGED: {}", damaged.size(), c.chunks(),
                                           fmt::join(damaged, ", "));
  }
  std::string out = fmt::format("{}: codes file format {}, {}\n", path, c.format, checks);
  out += fmt::format("audio: {} samples at {} Hz ({:.2f} s), source {}\n", c.samples, c.sample_rate, c.seconds(),
                     c.source.empty() ? "(not recorded)" : shown(c.source));  // the encoder's input's name, as the file says
  out += fmt::format("codes: {} frames of {} samples x {} tokens = {} rows x {} layers\n", c.frames(), c.frame,
                     c.tokens, c.frames() * c.tokens, c.layers);
  if (!c.codebook_sizes.empty()) {
    std::vector<int> bits;
    int64_t row_bits = 0;
    for (int64_t k : c.codebook_sizes) {
      bits.push_back(code_bits(k));
      row_bits += bits.back();
    }
    const int64_t packed_bytes = (row_bits * c.frames() * c.tokens + 7) / 8;
    out += fmt::format("codebooks: {} (bits {}); packed {:.3f} kbit/s ({} bytes of codes)", fmt::join(c.codebook_sizes, ", "),
                       fmt::join(bits, ", "), codes_packed_bitrate(c) / 1000, packed_bytes);
    if (c.format == 3)
      out += fmt::format(", coded {:.3f} kbit/s ({} bytes in the file, header included): {:.3f} of packed\n",
                         static_cast<double>(c.file_bytes) * 8 / c.seconds() / 1000, c.file_bytes,
                         static_cast<double>(c.file_bytes) / static_cast<double>(std::max<int64_t>(packed_bytes, 1)));
    else
      out += fmt::format(", entropy {:.3f} kbit/s; file {} bytes\n", codes_entropy_bitrate(c) / 1000, c.file_bytes);
  } else {
    out += fmt::format("codebooks: not recorded (format 1); entropy {:.3f} kbit/s\n", codes_entropy_bitrate(c) / 1000);
  }
  out += fmt::format("codec: weights fingerprint {}, checkpoint step {}{}\n", c.codec_fingerprint, c.checkpoint_step,
                     c.format == 3 ? fmt::format(", code model CRC32C {:08x}", c.code_model_crc) : std::string());
  return out;
}

std::string inspect_file(const std::string& path) {
  if (is_codes_file_format3(path)) return inspect_codes(path);
  const SafetensorsFile f = safetensors_load(path);
  auto format = f.metadata.find("format");
  if (format != f.metadata.end() && format->second.starts_with("vqddp-codes/")) return inspect_codes(path);
  return inspect_checkpoint(path);
}

}  // namespace vqddp
