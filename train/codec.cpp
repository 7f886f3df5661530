#include "train/codec.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <filesystem>

#include "data/audio.h"
#include "engine/error.h"
#include "engine/file_io.h"
#include "engine/json_strict.h"
#include "engine/safetensors.h"
#include "train/checkpoint.h"
#include "train/config.h"

namespace vqddp {

namespace {

constexpr const char* kCodesFormat = "vqddp-codes/1";
constexpr const char* kCodesSuffix = ".codes.safetensors";

using Clock = std::chrono::steady_clock;

// CRC32C of the model's weights: every parameter and buffer, name and
// bytes, in the model's order: what a codes file is tied to.
std::string weights_fingerprint(const Module& model) {
  uint32_t crc = 0;
  auto add = [&](const NamedTensors& tensors) {
    for (const auto& [name, t] : tensors) {
      Tensor host = t.to(Device::cpu());
      crc = crc32c(name.data(), name.size(), crc);
      crc = crc32c(host.raw_data(), host.nbytes(), crc);
    }
  };
  add(model.named_parameters());
  add(model.named_buffers());
  return fmt::format("{:08x}", crc);
}

int64_t metadata_count(const SafetensorsFile& f, const char* key) {
  auto it = f.metadata.find(key);
  VQDDP_CHECK(it != f.metadata.end(), "{}: not a complete codes file: __metadata__ has no '{}'", f.path, key);
  size_t used = 0;
  int64_t v = -1;
  try {
    v = std::stoll(it->second, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  VQDDP_CHECK(used == it->second.size() && v >= 0, "{}: __metadata__ '{}' is '{}', not a count", f.path, key,
              it->second);
  return v;
}

}  // namespace

Codec::Codec(const std::string& checkpoint) : path_(checkpoint) {
  SafetensorsFile f = read_checkpoint(checkpoint);
  config_ = checkpoint_config(f);
  Config cfg = parse_config(config_, checkpoint + ": __metadata__ 'config'");
  VQDDP_CHECK(cfg.data.type == "wav_frames", "{}: an audio codec's checkpoint (data.type \"wav_frames\") is needed to "
              "code audio; this run's data.type is \"{}\"", checkpoint, cfg.data.type);
  nlohmann::json facts = checkpoint_data_facts(f);
  if (facts.is_null()) {
    // Written before checkpoints kept the rate: the config's, if it set one.
    VQDDP_CHECK(cfg.data.sample_rate > 0, "{}: the checkpoint does not say its audio's sample rate (it was written "
                "before vqddp kept it, and its data.sample_rate is 0: the first clip's rate); resume the run with this "
                "vqddp to write a checkpoint that does", checkpoint);
    facts = data_facts(cfg.data.frame, cfg.data.sample_rate);
  }
  sample_rate_ = static_cast<int>(facts["sample_rate"].get<int64_t>());
  VQDDP_CHECK(sample_rate_ > 0, "{}: __metadata__ 'data' says sample rate 0: not an audio run", checkpoint);
  model_ = std::make_unique<CodecModel>(cfg.model, cfg.quantizer, facts["example_dim"].get<int64_t>(), cfg.run.seed);
  step_ = load_model_weights(f, *model_);
  model_->eval();
  sizes_ = model_->layer_sizes();
  residual_ = cfg.quantizer.type.starts_with("residual_");
  fingerprint_ = weights_fingerprint(*model_);
}

double Codec::bitrate(int layers) const {
  double bits = 0;
  for (int l = 0; l < layers; ++l) bits += std::log2(static_cast<double>(sizes_[l]));
  return bits * static_cast<double>(tokens()) * sample_rate_ / static_cast<double>(frame());
}

Tensor Codec::encode(const std::vector<float>& samples) const {
  const int64_t f = frame();
  VQDDP_CHECK(static_cast<int64_t>(samples.size()) % f == 0, "encode: {} samples are not whole frames of {}",
              samples.size(), f);
  return model_->encode(from_vector(samples, {static_cast<int64_t>(samples.size()) / f, f}));
}

std::vector<float> Codec::decode(const Tensor& codes) const {
  const int64_t rows = codes.size(0), have = codes.size(1), q = static_cast<int64_t>(sizes_.size());
  if (have == q) return model_->decode(codes).to_vector<float>();
  // The layers left out: -1, which a residual quantizer's decode skips.
  std::vector<int64_t> full(static_cast<size_t>(rows * q), -1);
  const int64_t* p = codes.data<int64_t>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t l = 0; l < have; ++l) full[r * q + l] = p[r * have + l];
  return model_->decode(from_vector(full, {rows, q})).to_vector<float>();
}

std::string output_path(const std::string& dir, const std::string& name, bool overwrite, const std::string& command) {
  std::filesystem::create_directories(dir);
  std::string path = (std::filesystem::path(dir) / name).string();
  VQDDP_CHECK(overwrite || !std::filesystem::exists(path), "{}: exists already; {} --overwrite replaces it", path,
              command);
  return path;
}

std::string codes_file_name(const std::string& input) {
  return std::filesystem::path(input).stem().string() + kCodesSuffix;
}

std::string decoded_file_name(const std::string& codes_path) {
  std::string stem = std::filesystem::path(codes_path).filename().string();
  if (stem.ends_with(kCodesSuffix)) stem.resize(stem.size() - std::string(kCodesSuffix).size());
  else stem = std::filesystem::path(stem).stem().string();
  return stem + ".wav";
}

CodingResult encode_audio_file(const Codec& codec, const std::string& input, const std::string& out_dir,
                               const EncodeOptions& o) {
  const int q = static_cast<int>(codec.layer_sizes().size());
  const int layers = o.layers == 0 ? q : o.layers;
  VQDDP_CHECK(layers >= 1 && layers <= q, "encode: --layers {} is not in 1..{} (the codec's layers)", o.layers, q);
  VQDDP_CHECK(layers == q || codec.layers_are_residual(), "encode: --layers {} of {}: this codec's quantizer (\"{}\") "
              "has no residual layers to leave out", layers, q, codec.config()["quantizer"].value("type", "?"));
  VQDDP_CHECK(o.chunk_frames > 0, "encode: chunks of {} frames", o.chunk_frames);
  CodingResult r;
  r.layers = layers;
  r.output = output_path(out_dir, codes_file_name(input), o.overwrite, "encode");
  const auto start = Clock::now();
  const int64_t f = codec.frame();
  AudioReader reader(input, codec.sample_rate());
  std::vector<int64_t> codes;  // (rows, layers)
  std::vector<float> chunk;    // (chunk_frames * F,): the only audio held at once
  for (;;) {
    chunk.clear();
    const size_t got = reader.read(static_cast<size_t>(o.chunk_frames * f), chunk);
    if (got == 0) break;
    r.samples += static_cast<int64_t>(got);
    chunk.resize((got + f - 1) / f * f, 0.f);  // the last frame padded with zeros
    Tensor c = codec.encode(chunk);            // (n * tokens, Q)
    const int64_t* p = c.data<int64_t>();
    for (int64_t row = 0; row < c.size(0); ++row) codes.insert(codes.end(), p + row * q, p + row * q + layers);
    r.frames += static_cast<int64_t>(chunk.size()) / f;
  }
  const int64_t rows = static_cast<int64_t>(codes.size()) / layers;
  safetensors_save(r.output, {{"codes", from_vector(codes, {rows, layers})}},
                   {{"format", kCodesFormat},
                    {"sample_rate", std::to_string(codec.sample_rate())},
                    {"samples", std::to_string(r.samples)},
                    {"frame", std::to_string(f)},
                    {"tokens", std::to_string(codec.tokens())},
                    {"layers", std::to_string(layers)},
                    {"config", codec.config().dump()},
                    {"codec_fingerprint", codec.fingerprint()},
                    {"checkpoint_step", std::to_string(codec.step())},
                    {"source", std::filesystem::path(input).filename().string()}});
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return r;
}

CodingResult decode_codes_file(const Codec& codec, const std::string& path, const std::string& out_dir,
                               const DecodeOptions& o) {
  VQDDP_CHECK(o.chunk_frames > 0, "decode: chunks of {} frames", o.chunk_frames);
  const auto start = Clock::now();
  SafetensorsFile file = safetensors_load(path);
  auto format = file.metadata.find("format");
  VQDDP_CHECK(format != file.metadata.end() && format->second == kCodesFormat, "{}: not a vqddp codes file (format "
              "'{}'; `vqddp encode` writes {})", path, format == file.metadata.end() ? "" : format->second, kCodesFormat);
  VQDDP_CHECK(file.checksummed, "{}: a codes file must carry checksums but its __metadata__ has none: the header is "
              "damaged", path);
  const std::string& fp = file.metadata.count("codec_fingerprint") ? file.metadata.at("codec_fingerprint") : "";
  VQDDP_CHECK(fp == codec.fingerprint(), "{}: coded by a codec whose weights have fingerprint '{}', but this "
              "checkpoint's (step {}) are '{}': decode with the checkpoint that encoded it", path, fp, codec.step(),
              codec.fingerprint());
  const int64_t rate = metadata_count(file, "sample_rate"), samples = metadata_count(file, "samples"),
                f = metadata_count(file, "frame"), tokens = metadata_count(file, "tokens"),
                layers_said = metadata_count(file, "layers");
  VQDDP_CHECK(rate == codec.sample_rate() && f == codec.frame() && tokens == codec.tokens(),
              "{}: coded at {} Hz in frames of {} samples, {} tokens each; this codec takes {} Hz, {}, {}", path, rate,
              f, tokens, codec.sample_rate(), codec.frame(), codec.tokens());
  const Tensor& codes = file.at("codes");
  const int64_t q = static_cast<int64_t>(codec.layer_sizes().size());
  // The sample count bounded by the codes' rows first, so nothing below overflows.
  const bool fits = codes.dim() == 2 && samples <= codes.size(0) / tokens * f;
  const int64_t frames = fits ? (samples + f - 1) / f : -1;
  VQDDP_CHECK(fits && codes.dtype() == DType::i64 && codes.size(0) == frames * tokens && codes.size(1) >= 1 &&
                  codes.size(1) <= q && codes.size(1) == layers_said,
              "{}: tensor 'codes' is {}; {} samples in frames of {} need int64 [{} frames x {} tokens, layers 1..{}] "
              "(metadata 'layers' {})", path, codes.desc(), samples, f, samples / f + (samples % f != 0), tokens, q, layers_said);
  VQDDP_CHECK(codes.size(1) == q || codec.layers_are_residual(), "{}: {} of {} layers, but this codec's quantizer has "
              "no residual layers to leave out", path, codes.size(1), q);
  const int64_t layers = codes.size(1);
  const int64_t* p = codes.data<int64_t>();
  for (int64_t i = 0; i < codes.numel(); ++i) {
    const int64_t l = i % layers, size = codec.layer_sizes()[static_cast<size_t>(l)];
    VQDDP_CHECK(p[i] >= 0 && p[i] < size, "{}: code {} of layer {} in row {} is outside its codebook of {}", path, p[i],
                l, i / layers, size);
  }
  CodingResult r;
  r.layers = static_cast<int>(layers);
  r.frames = frames;
  r.samples = samples;
  r.output = output_path(out_dir, decoded_file_name(path), o.overwrite, "decode");
  AudioWriter out(r.output, codec.sample_rate(), o.float_wav ? AudioEncoding::wav_float : AudioEncoding::wav16);
  for (int64_t at = 0; at < frames; at += o.chunk_frames) {
    const int64_t end = std::min(frames, at + o.chunk_frames);
    std::vector<float> y = codec.decode(codes.slice_rows(at * tokens, end * tokens));
    const int64_t keep = std::min<int64_t>(static_cast<int64_t>(y.size()), samples - at * f);  // the padding goes
    out.write(y.data(), static_cast<size_t>(keep));
  }
  out.close();
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return r;
}

}  // namespace vqddp
