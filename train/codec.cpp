#include "train/codec.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>

#include "data/audio.h"
#include "engine/core/error.h"
#include "engine/core/file_io.h"
#include "engine/core/json_strict.h"
#include "engine/core/output_file.h"
#include "engine/core/safetensors.h"
#include "train/codes_file.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "vq/quantizer_kind.h"

namespace vqddp {

namespace {

constexpr const char* kCodesSuffix = ".codes";
constexpr const char* kOldCodesSuffix = ".codes.safetensors";  // formats 1 and 2

using Clock = std::chrono::steady_clock;

// CRC32C of the model's weights: every parameter and buffer, name and
// bytes, in the model's order: what a codes file is tied to.
uint32_t weights_fingerprint(const Module& model) {
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
  return crc;
}

// The code model (train/codes_file.h): layer l's EMA code counts, the
// buffer quantizer.layer{l}.cluster_size (or the one cluster_size of a
// codebook shared by every layer), where the quantizer keeps them.
CodeModel code_model_of(const Module& model, const std::vector<int64_t>& sizes) {
  std::map<std::string, std::vector<double>> found;
  for (const auto& [name, t] : model.named_buffers())
    if (name.ends_with(".cluster_size") && t.dtype() == DType::f32) {
      const std::vector<float> v = t.to(Device::cpu()).to_vector<float>();
      found[name] = std::vector<double>(v.begin(), v.end());
    }
  std::vector<std::vector<double>> counts(sizes.size());
  for (size_t l = 0; l < sizes.size(); ++l) {
    auto it = found.find(fmt::format("quantizer.layer{}.cluster_size", l));
    if (it == found.end() && found.size() == 1) it = found.begin();
    if (it != found.end() && static_cast<int64_t>(it->second.size()) == sizes[l]) counts[l] = it->second;
  }
  return CodeModel::from_counts(sizes, counts);
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
  residual_ = cfg.quantizer.kind().residual;
  fingerprint_value_ = weights_fingerprint(*model_);
  fingerprint_ = fmt::format("{:08x}", fingerprint_value_);
  code_model_ = code_model_of(*model_, sizes_);
}

void Codec::check_layers(int layers, const char* command) const {
  const int q = static_cast<int>(sizes_.size());
  VQDDP_CHECK(layers >= 1 && layers <= q, "{}: --layers {} is not in 1..{} (the codec's layers)", command, layers, q);
  VQDDP_CHECK(layers == q || residual_, "{}: --layers {} of {}: this codec's quantizer (\"{}\") has no residual layers "
              "to leave out", command, layers, q, config_["quantizer"].value("type", "?"));
}

double Codec::bitrate(int layers) const {
  double bits = 0;
  for (int l = 0; l < layers; ++l) bits += std::log2(static_cast<double>(sizes_[l]));
  return bits * static_cast<double>(tokens()) * sample_rate_ / static_cast<double>(frame());
}

namespace {
void check_streams(const Codec& codec, const std::string& path, const char* command) {
  VQDDP_CHECK(codec.causal(), "{}: {}: the codec is not causal (its model.causal is false): each frame's codes depend "
              "on samples after it, so it codes files, not streams; train with model.causal true "
              "(examples/speech_codec_causal.json)", command, path);
}
}  // namespace

EncoderStream Codec::encoder_stream(const char* command) const {
  check_streams(*this, path_, command);
  return EncoderStream(*model_);
}

DecoderStream Codec::decoder_stream(const char* command) const {
  check_streams(*this, path_, command);
  return DecoderStream(*model_);
}

Tensor Codec::encode(const std::vector<float>& samples) const {
  const int64_t f = frame();
  VQDDP_CHECK(static_cast<int64_t>(samples.size()) % f == 0, "encode: {} samples are not whole frames of {}",
              samples.size(), f);
  return model_->encode(from_vector(samples, {static_cast<int64_t>(samples.size()) / f, f}));
}

std::vector<float> Codec::decode(const Tensor& codes) const { return model_->decode(codes).to_vector<float>(); }

CodesFile Codec::codes_for(int layers, const std::string& source) const {
  CodesFile c;
  c.layers = layers;
  c.sample_rate = sample_rate_;
  c.frame = frame();
  c.tokens = tokens();
  c.codebook_sizes.assign(sizes_.begin(), sizes_.begin() + layers);
  c.codec_fingerprint = fingerprint_;
  c.checkpoint_step = step_;
  c.source = source;
  return c;
}

void Codec::append_codes(std::vector<float> chunk, CodesFile& c, Pieces& pieces) const {
  const int64_t f = frame(), q = static_cast<int64_t>(sizes_.size()), layers = c.layers;
  c.samples += static_cast<int64_t>(chunk.size());
  chunk.resize((chunk.size() + f - 1) / f * f, 0.f);  // the last frame padded with zeros
  Tensor t = causal() ? model_->encode_stream(from_vector(chunk, {static_cast<int64_t>(chunk.size())}), pieces.encoder)
                      : encode(chunk);  // (n * tokens, Q)
  const int64_t* p = t.data<int64_t>();
  for (int64_t row = 0; row < t.size(0); ++row) c.codes.insert(c.codes.end(), p + row * q, p + row * q + layers);
}

std::vector<float> Codec::decode_frames(const int64_t* codes, int64_t frames, int64_t layers, Pieces& pieces) const {
  const int64_t rows = frames * tokens();
  Tensor t = from_vector(std::vector<int64_t>(codes, codes + rows * layers), {rows, layers});
  return causal() ? model_->decode_stream(t, pieces.decoder).to_vector<float>() : decode(t);
}

std::string Codec::file_within(CodesFile& c, double max_bitrate, const std::string& what) const {
  std::string bytes = codes_file_bytes(c, code_model_);
  if (max_bitrate <= 0) return bytes;
  const int layers = static_cast<int>(c.layers), q = static_cast<int>(sizes_.size());
  // The file with the first `l` layers of c's.
  auto with_layers = [&](int l) {
    CodesFile k = c;
    k.layers = l;
    k.codebook_sizes.resize(static_cast<size_t>(l));
    k.codes.clear();
    for (int64_t row = 0; row < c.rows(); ++row)
      k.codes.insert(k.codes.end(), c.codes.begin() + row * layers, c.codes.begin() + row * layers + l);
    return k;
  };
  std::string offered;
  for (int l = layers; l >= 1; --l) {
    if (l < q && !residual_) break;
    CodesFile k = l == layers ? CodesFile{} : with_layers(l);
    std::string b = l == layers ? std::move(bytes) : codes_file_bytes(k, code_model_);
    const double rate = static_cast<double>(b.size()) * 8 / c.seconds();
    offered += fmt::format("{}{} layer{}: {:.3f}", offered.empty() ? "" : ", ", l, l == 1 ? "" : "s", rate / 1000);
    if (rate <= max_bitrate * (1 + 1e-12)) {
      if (l < layers) c = std::move(k);
      return b;
    }
  }
  VQDDP_THROW("{}: no choice of layers codes within --bitrate {} kbit/s; its files would take (kbit/s, header "
              "included) {}", what, max_bitrate / 1000, offered);
}

std::string codes_file_name(const std::string& input) {
  return std::filesystem::path(input).stem().string() + kCodesSuffix;
}

std::string decoded_file_name(const std::string& codes_path) {
  std::string stem = std::filesystem::path(codes_path).filename().string();
  if (stem.ends_with(kOldCodesSuffix)) stem.resize(stem.size() - std::string(kOldCodesSuffix).size());
  else if (stem.ends_with(kCodesSuffix)) stem.resize(stem.size() - std::string(kCodesSuffix).size());
  else stem = std::filesystem::path(stem).stem().string();
  return stem + ".wav";
}

CodingResult encode_audio_file(const Codec& codec, const std::string& input, OutputDir& out,
                               const EncodeOptions& o) {
  const int q = static_cast<int>(codec.layer_sizes().size());
  const int layers = o.layers == 0 ? q : o.layers;
  VQDDP_CHECK(o.max_bitrate == 0 || o.layers == 0, "encode: give --layers or --bitrate, not both");
  codec.check_layers(layers, "encode");
  VQDDP_CHECK(o.chunk_frames > 0, "encode: chunks of {} frames", o.chunk_frames);
  CodingResult r;
  r.output = out.path_for(codes_file_name(input), o.overwrite);
  const auto start = Clock::now();
  AudioReader reader(input, codec.sample_rate());
  CodesFile c = codec.codes_for(layers, std::filesystem::path(input).filename().string());
  c.chunk_frames = o.chunk_frames;
  std::vector<float> chunk;  // (chunk_frames * F,): the only audio held at once
  Codec::Pieces pieces;
  for (;;) {
    chunk.clear();
    if (reader.read(static_cast<size_t>(o.chunk_frames * codec.frame()), chunk) == 0) break;
    codec.append_codes(std::move(chunk), c, pieces);
  }
  VQDDP_CHECK(c.samples > 0, "{}: no audio to code", input);
  r.samples = c.samples;
  r.frames = c.frames();
  // With --bitrate, the most layers whose file (its real size: the header
  // and each chunk's length and CRC included) is within it.
  const std::string bytes = codec.file_within(c, o.max_bitrate, "encode: " + input);
  r.layers = static_cast<int>(c.layers);
  out.create();
  {
    OutputFile f(r.output);
    f.write(bytes.data(), bytes.size());
    f.commit();
  }
  r.bytes = static_cast<int64_t>(bytes.size());
  r.coded_bitrate = static_cast<double>(bytes.size()) * 8 / c.seconds();
  r.entropy_bitrate = codes_entropy_bitrate(c);
  r.packed_bitrate = codes_packed_bitrate(c);
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return r;
}

namespace {

// Refuses, naming the file, codes this codec cannot decode: another codec's
// weights, rate, frame or tokens, more layers than it has (or fewer, where
// its layers are not residual), other codebook sizes, a code outside its
// codebook (format 1), a code model other than its own, and damaged chunks
// (format 3) unless `skip_damaged`.
void check_decodable(const Codec& codec, const CodesFile& c, const std::string& path, bool skip_damaged) {
  VQDDP_CHECK(c.codec_fingerprint == codec.fingerprint(), "{}: coded by a codec whose weights have fingerprint '{}', "
              "but this checkpoint's (step {}) are '{}': decode with the checkpoint that encoded it", path,
              c.codec_fingerprint, codec.step(), codec.fingerprint());
  VQDDP_CHECK(c.sample_rate == codec.sample_rate() && c.frame == codec.frame() && c.tokens == codec.tokens(),
              "{}: coded at {} Hz in frames of {} samples, {} tokens each; this codec takes {} Hz, {}, {}", path,
              c.sample_rate, c.frame, c.tokens, codec.sample_rate(), codec.frame(), codec.tokens());
  const int64_t q = static_cast<int64_t>(codec.layer_sizes().size()), layers = c.layers;
  VQDDP_CHECK(layers <= q, "{}: {} layers, but this codec has {}", path, layers, q);
  VQDDP_CHECK(layers == q || codec.layers_are_residual(), "{}: {} of {} layers, but this codec's quantizer has "
              "no residual layers to leave out", path, layers, q);
  for (int64_t l = 0; l < layers; ++l)
    VQDDP_CHECK(c.codebook_sizes.empty() || c.codebook_sizes[l] == codec.layer_sizes()[l], "{}: layer {} was coded "
                "with a codebook of {}, this codec's has {}", path, l, c.codebook_sizes[l], codec.layer_sizes()[l]);
  // Format 2 checked its codes against the sizes compared above; format 1
  // did not say its sizes, so its codes are held to the codec's.
  for (size_t i = 0; c.codebook_sizes.empty() && i < c.codes.size(); ++i) {
    const int64_t l = static_cast<int64_t>(i) % layers, size = codec.layer_sizes()[static_cast<size_t>(l)];
    VQDDP_CHECK(c.codes[i] >= 0 && c.codes[i] < size, "{}: code {} of layer {} in row {} is outside its codebook of {}",
                path, c.codes[i], l, static_cast<int64_t>(i) / layers, size);
  }
  check_code_model(c, codec.code_model(), path);
  if (c.format == 3) {
    // Every chunk's checksum before any output: damaged chunks are refused,
    // all of them named, unless asked to decode around them.
    const std::vector<DamagedChunk> damaged = damaged_chunks(path);
    std::vector<std::string> others;
    for (size_t d = 1; d < damaged.size(); ++d) others.push_back(damaged[d].described);
    VQDDP_CHECK(damaged.empty() || skip_damaged, "{}{}; `vqddp decode --skip-damaged` decodes the other chunks, "
                "silence in the damaged ones' place", damaged.empty() ? "" : damaged[0].why,
                others.empty() ? std::string() : fmt::format(" (and {} more: {})", others.size(), fmt::join(others, ", ")));
  }
}

}  // namespace

CodingResult decode_codes_file(const Codec& codec, const std::string& path, OutputDir& out, const DecodeOptions& o) {
  VQDDP_CHECK(o.chunk_frames > 0, "decode: chunks of {} frames", o.chunk_frames);
  const auto start = Clock::now();
  const CodesFile c = read_codes_header(path);  // format 3: the header (the codes a chunk at a time below)
  check_decodable(codec, c, path, o.skip_damaged);
  const int64_t layers = c.layers;
  if (c.format == 1)
    fmt::print(stderr, "vqddp: note: {} is a format-1 codes file (8 bytes a code, metadata not under its checksum); "
               "`vqddp encode` writes format 3\n", path);
  CodingResult r;
  r.layers = static_cast<int>(layers);
  r.frames = c.frames();
  r.samples = c.samples;
  r.output = out.path_for(decoded_file_name(path), o.overwrite);
  out.create();
  AudioWriter writer(r.output, codec.sample_rate(), o.float_wav ? AudioEncoding::wav_float : AudioEncoding::wav16);
  const int64_t tokens = c.tokens, f = c.frame;
  // A causal codec decodes the file as one sequence; a damaged chunk's
  // silence does not enter its state, which goes on from the last chunk
  // decoded.
  Codec::Pieces pieces;
  // `frames` frames of codes from frame `first` on, decoded o.chunk_frames at a time.
  auto decode_frames = [&](const int64_t* codes, int64_t first, int64_t frames) {
    for (int64_t at = 0; at < frames; at += o.chunk_frames) {
      const int64_t end = std::min(frames, at + o.chunk_frames);
      std::vector<float> y = codec.decode_frames(codes + at * tokens * layers, end - at, layers, pieces);
      const int64_t keep = std::min<int64_t>(static_cast<int64_t>(y.size()), r.samples - (first + at) * f);  // the padding goes
      writer.write(y.data(), static_cast<size_t>(keep));
    }
  };
  if (c.format == 3) {
    CodesReader reader(path);
    CodesReader::Chunk k;
    while (reader.next(k)) {
      if (k.damaged) {
        VQDDP_CHECK(o.skip_damaged, "{}", k.why);
        fmt::print(stderr, "vqddp: warning: {}; silence written in its place\n", k.why);
        const std::vector<float> silence(static_cast<size_t>(
            std::min(k.frames * f, r.samples - k.first_frame * f)), 0.f);
        writer.write(silence.data(), silence.size());
        ++r.damaged_chunks;
        continue;
      }
      const std::vector<int64_t> codes = reader.codes(k, codec.code_model());
      decode_frames(codes.data(), k.first_frame, k.frames);
    }
  } else {
    decode_frames(c.codes.data(), 0, r.frames);
  }
  writer.close();
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return r;
}

}  // namespace vqddp
