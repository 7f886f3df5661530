// A trained codec in use (train/codec.h, `vqddp encode/decode`) and a run's
// report (tool/report.h): codes files reproduce the validation figures,
// chunked coding equals whole, bad codes files are refused by name, and the
// report of an audio and an image run has data in every plot and audio that
// decodes.
#include <doctest/doctest.h>

#include <cmath>
#include <numbers>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "data/audio.h"
#include "data/dataset.h"
#include "engine/core/error.h"
#include "engine/core/safetensors.h"
#include "tests/engine/tmpdir.h"
#include "tests/train/small_run.h"
#include "tool/report.h"
#include "comm/single.h"
#include "engine/autograd.h"
#include "train/checkpoint.h"
#include "train/codec.h"
#include "train/codes_file.h"
#include "engine/core/output_file.h"
#include "train/spectral.h"
#include "tool/classic_codec.h"
#include "tool/eval.h"
#include "train/stoi.h"

using namespace vqddp;
using vqddp::test::TempDir;

namespace {

constexpr const char* kAsterisk = "/usr/share/asterisk/sounds/en_US_f_Allison";

// A small conv codec (hop 8, frames of 256 samples, 3 residual layers of 16
// codes) trained for a few steps on FLAC copies of 4 asterisk prompts, the
// 4th held out, so the run's validation figures are that one clip's; with
// metrics, run.json and clips written.
struct TrainedCodec {
  TempDir dir;
  std::vector<std::string> clips;  // the FLAC files, in name order
  TrainResult result;
  std::string checkpoint;

  explicit TrainedCodec(uint64_t seed) {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(kAsterisk))
      if (e.path().extension() == ".wav") names.push_back(e.path().string());
    std::sort(names.begin(), names.end());
    REQUIRE(names.size() >= 4);
    std::filesystem::create_directories(dir.file("flac"));
    for (size_t i = 0; i < 4; ++i) {
      clips.push_back(dir.file("flac/" + std::filesystem::path(names[i]).stem().string() + ".flac"));
      convert_audio(names[i], clips.back(), 0, AudioEncoding::flac16);
    }
    nlohmann::json j = {
        {"model", {{"type", "conv_codec"}, {"channels", {4, 8, 8}}, {"strides", {2, 4}}, {"latent_dim", 4},
                   {"activation", "elu"}}},
        {"quantizer", {{"type", "residual_vq"}, {"num_quantizers", 3}, {"codebook_size", 16}, {"decay", 0.9},
                       {"kmeans_iters", 3}}},
        {"data", {{"type", "wav_frames"}, {"sources", {{{"path", dir.file("flac")}}}}, {"frame", 256},
                  {"holdout_every", 4}}},
        {"optimizer", {{"lr", 0.005}}},
        {"schedule", {{"batch_size", 16}, {"steps", 6}, {"log_every", 2}, {"validate_every", 3}}},
        {"distributed", {{"world_size", 2}, {"timeout_s", 20}}},
        {"run", {{"dir", dir.file("run")}, {"seed", seed}}}};
    Config cfg = parse_config(j, "test");
    // Printing: the run writes metrics.jsonl, run.json and clips for the report.
    result = train(cfg, load_dataset(cfg.data), TrainOptions{});
    checkpoint = dir.file("run/checkpoint.safetensors");
  }
};

const TrainedCodec& trained() {
  static TrainedCodec t(5);
  return t;
}

std::vector<float> samples_of(const std::string& path) { return read_audio(path).samples; }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

// One file through a command's OutputDir, as the CLI does.
CodingResult encode_into(const Codec& codec, const std::string& input, const std::string& dir, const EncodeOptions& o) {
  OutputDir out(dir, "encode");
  CodingResult r = encode_audio_file(codec, input, out, o);
  out.keep();
  return r;
}

CodingResult decode_into(const Codec& codec, const std::string& codes, const std::string& dir, const DecodeOptions& o) {
  OutputDir out(dir, "decode");
  CodingResult r = decode_codes_file(codec, codes, out, o);
  out.keep();
  return r;
}

DecodeOptions float_wav() {
  DecodeOptions o;
  o.float_wav = true;
  return o;
}

}  // namespace

TEST_CASE("encode then decode of a held-out clip gives the run's validation figures of that clip, bit for bit") {
  const TrainedCodec& t = trained();
  Codec codec(t.checkpoint);
  CHECK(codec.sample_rate() == 8000);
  CHECK(codec.frame() == 256);
  CHECK(codec.tokens() == 32);
  CHECK(codec.bitrate(3) == 3 * 4 * 32 * 8000.0 / 256);
  TempDir out;
  EncodeOptions enc;
  enc.chunk_frames = 3;  // not the validation's batch: the forward is batch-invariant
  CodingResult e = encode_into(codec, t.clips[3], out.file("codes"), enc);
  CodingResult d = decode_into(codec, e.output, out.file("wav"), float_wav());
  const std::vector<float> x = samples_of(t.clips[3]), y = samples_of(d.output);
  REQUIRE(y.size() == x.size());  // the last frame's padding is cut off
  CHECK(e.samples == static_cast<int64_t>(x.size()));
  // Sample for sample, the model's eval forward (what validation measures)
  // of the clip's whole frames.
  const int64_t whole = static_cast<int64_t>(x.size()) / 256;
  {
    SafetensorsFile f = read_checkpoint(t.checkpoint);
    Config cfg = parse_config(checkpoint_config(f), "checkpoint");
    CodecModel model(cfg.model, cfg.quantizer, 256, cfg.run.seed);
    load_model_weights(f, model);
    model.eval();
    NoGradGuard no_grad;
    SingleCommunicator local;
    const std::vector<float> r =
        model.forward(from_vector(std::vector<float>(x.begin(), x.begin() + whole * 256), {whole, 256}), local)
            .reconstruction.to_vector<float>();
    CHECK(r == std::vector<float>(y.begin(), y.begin() + whole * 256));
  }
  // The validation's sums over the clip's whole frames (its tail is not a
  // frame), in its order and precision (train/validation.cpp).
  const int64_t n = static_cast<int64_t>(x.size()) / 256 * 256;
  double signal = 0, error = 0;
  for (int64_t i = 0; i < n; ++i) {
    signal += double(x[i]) * x[i];
    error += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
  }
  const float fs = static_cast<float>(signal), fe = static_cast<float>(error), fn = static_cast<float>(n);
  LogMel mel(8000.0, 256, 64, 40);
  SumCount l1 = log_mel_l1(mel, from_vector(std::vector<float>(x.begin(), x.begin() + n), {1, n}),
                           from_vector(std::vector<float>(y.begin(), y.begin() + n), {1, n}));
  CHECK(t.result.validation_mse == fe / fn);
  CHECK(t.result.validation_snr_db == 10 * std::log10(double(fs) / fe));
  CHECK(t.result.validation_log_mel == static_cast<float>(l1.sum) / static_cast<float>(l1.count));
  // STOI of the held-out chunk (the one clip's whole frames), as a float
  // through the reduce.
  const double intelligibility = stoi(std::vector<float>(x.begin(), x.begin() + n),
                                      std::vector<float>(y.begin(), y.begin() + n), 8000);
  CHECK(intelligibility > 0.1);  // 6 steps of a tiny codec: little, but a score
  CHECK(t.result.validation_stoi == static_cast<float>(intelligibility));
}

TEST_CASE("a file coded in chunks has the codes and the audio of coding it whole; fewer layers code fewer bits") {
  const TrainedCodec& t = trained();
  Codec codec(t.checkpoint);
  TempDir out;
  EncodeOptions one, whole, two;
  one.chunk_frames = 1;
  whole.chunk_frames = 1 << 20;
  two.layers = 2;
  const std::string input = t.clips[0];
  const CodesFile a = read_codes_file(encode_into(codec, input, out.file("one"), one).output, &codec.code_model());
  const CodesFile b = read_codes_file(encode_into(codec, input, out.file("whole"), whole).output, &codec.code_model());
  CHECK(a.codes == b.codes);
  CHECK(a.layers == 3);
  DecodeOptions dec_one = float_wav(), dec_whole = float_wav();
  dec_one.chunk_frames = 1;
  dec_whole.chunk_frames = 1 << 20;
  const std::string codes = out.file("one/") + codes_file_name(input);
  CHECK(samples_of(decode_into(codec, codes, out.file("dec_one"), dec_one).output) ==
        samples_of(decode_into(codec, codes, out.file("dec_whole"), dec_whole).output));
  // Two of three layers: the first two columns, decoded without the third.
  CodingResult e2 = encode_into(codec, input, out.file("two"), two);
  const CodesFile c = read_codes_file(e2.output, &codec.code_model());
  REQUIRE(c.layers == 2);
  REQUIRE(c.rows() == a.rows());
  const std::vector<int64_t>& va = a.codes;
  const std::vector<int64_t>& vc = c.codes;
  for (int64_t r = 0; r < a.rows(); ++r)
    for (int64_t l = 0; l < 2; ++l) REQUIRE(vc[r * 2 + l] == va[r * 3 + l]);
  CHECK(codec.bitrate(2) == codec.bitrate(3) * 2 / 3);
  const std::vector<float> full = samples_of(out.file("dec_one/") + std::filesystem::path(input).stem().string() + ".wav");
  const std::vector<float> fewer = samples_of(decode_into(codec, e2.output, out.file("dec_two"), float_wav()).output);
  REQUIRE(fewer.size() == full.size());
  CHECK(fewer != full);
  // An existing output is not replaced unless asked.
  CHECK(error_of([&] { encode_into(codec, input, out.file("two"), two); }).find("exists already") !=
        std::string::npos);
  two.overwrite = true;
  CHECK_NOTHROW(encode_into(codec, input, out.file("two"), two));
  // A 16-bit decode is the float one to the nearest 1/32768.
  const std::vector<float> pcm = samples_of(decode_into(codec, codes, out.file("dec16"), DecodeOptions{}).output);
  REQUIRE(pcm.size() == full.size());
  for (size_t i = 0; i < pcm.size(); ++i)
    REQUIRE(pcm[i] == std::clamp(std::nearbyint(full[i] * 32768.f), -32768.f, 32767.f) / 32768.f);
}

TEST_CASE("decode refuses, naming the file, a damaged codes file, another codec's codes and codes outside a codebook") {
  const TrainedCodec& t = trained();
  Codec codec(t.checkpoint);
  TempDir out;
  const std::string codes = encode_into(codec, t.clips[1], out.file("codes"), EncodeOptions{}).output;
  // A flipped byte in the codes (the last byte of the file is data).
  const std::string damaged = out.file("damaged.codes.safetensors");
  std::filesystem::copy_file(codes, damaged);
  {
    std::fstream f(damaged, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    char c = 0;
    f.get(c);
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(c ^ 1));
  }
  std::string msg = error_of([&] { decode_into(codec, damaged, out.file("wav"), DecodeOptions{}); });
  CHECK(msg.find(damaged) != std::string::npos);
  CHECK(msg.find("checksum") != std::string::npos);
  // Codes outside their codebook, in a file whose checksums fit: a format-1
  // file (int64 codes, as vqddp wrote before), which still decodes.
  const CodesFile packed = read_codes_file(codes, &codec.code_model());
  std::map<std::string, std::string> meta = {
      {"format", "vqddp-codes/1"}, {"sample_rate", "8000"}, {"samples", std::to_string(packed.samples)},
      {"frame", "256"}, {"tokens", "32"}, {"layers", "3"}, {"codec_fingerprint", packed.codec_fingerprint},
      {"checkpoint_step", "6"}, {"source", packed.source}};
  const std::string old = out.file("old.codes.safetensors");
  safetensors_save(old, {{"codes", from_vector(packed.codes, {packed.rows(), 3})}}, meta);
  CHECK(samples_of(decode_into(codec, old, out.file("old_wav"), float_wav()).output) ==
        samples_of(decode_into(codec, codes, out.file("new_wav"), float_wav()).output));
  std::vector<int64_t> v = packed.codes;
  v[4] = 16;
  const std::string outside = out.file("outside.codes.safetensors");
  safetensors_save(outside, {{"codes", from_vector(v, {packed.rows(), 3})}}, meta);
  msg = error_of([&] { decode_into(codec, outside, out.file("wav"), DecodeOptions{}); });
  CHECK(msg.find(outside) != std::string::npos);
  CHECK(msg.find("code 16 of layer 1 in row 1 is outside its codebook of 16") != std::string::npos);
  // A checkpoint is not a codes file.
  msg = error_of([&] { decode_into(codec, t.checkpoint, out.file("wav"), DecodeOptions{}); });
  CHECK(msg.find("not a vqddp codes file") != std::string::npos);
  // Another codec: the same checkpoint with one weight changed (a checkpoint
  // of its own, checksums and all), so its weights' fingerprint differs.
  SafetensorsFile ck = safetensors_load(t.checkpoint);
  NamedTensors changed;
  for (const auto& [name, tensor] : ck.tensors) changed.emplace_back(name, tensor.clone());
  REQUIRE(changed[0].first.starts_with("param."));
  changed[0].second.data<float>()[0] += 1.f;
  const std::string other = out.file("other.safetensors");
  safetensors_save(other, changed, ck.metadata);
  Codec second(other);
  REQUIRE(second.fingerprint() != codec.fingerprint());
  msg = error_of([&] { decode_into(second, codes, out.file("wav"), DecodeOptions{}); });
  CHECK(msg.find(codes) != std::string::npos);
  CHECK(msg.find("decode with the checkpoint that encoded it") != std::string::npos);
  CHECK(!std::filesystem::exists(out.file("wav")));  // nothing was written for any of them
  // Fewer layers than the codec's need a residual quantizer; --layers out of range.
  EncodeOptions four;
  four.layers = 4;
  CHECK(error_of([&] { encode_into(codec, t.clips[1], out.file("c4"), four); }).find("--layers 4 is not in 1..3") !=
        std::string::npos);
}

TEST_CASE("a 10 s clip is entropy-coded under the checkpoint's code counts: decodes bit for bit as packed codes do, "
          "its file within 1.03x the ideal length; a damaged chunk is named and the others still decode") {
  const TrainedCodec& t = trained();
  Codec codec(t.checkpoint);
  const CodeModel& model = codec.code_model();
  REQUIRE(model.layers() == 3);
  // The tables are the EMA code counts (skewed), not uniform.
  uint32_t top = 0;
  for (int64_t l = 0; l < 3; ++l) {
    CHECK(model.counted(l));
    for (uint32_t f : model.frequencies(l)) top = std::max(top, f);
  }
  CHECK(top > 2 * 65536 / 16);
  // 10 s of the asterisk prompts back to back.
  std::vector<float> ten;
  for (size_t i = 0; ten.size() < 80000; i = (i + 1) % t.clips.size()) {
    const std::vector<float> x = samples_of(t.clips[i]);
    ten.insert(ten.end(), x.begin(), x.begin() + std::min(x.size(), 80000 - ten.size()));
  }
  TempDir out;
  {
    AudioWriter w(out.file("ten.wav"), 8000, AudioEncoding::wav_float);
    w.write(ten.data(), ten.size());
    w.close();
  }
  EncodeOptions o;
  o.chunk_frames = 100;  // 313 frames: 4 chunks
  const CodingResult e = encode_into(codec, out.file("ten.wav"), out.file("codes"), o);
  const CodesFile c = read_codes_file(e.output, &model);
  CHECK(c.format == 3);
  CHECK(c.chunks() == 4);
  const double ideal_bytes = codes_ideal_bits(c, model) / 8;
  const auto bytes = static_cast<double>(std::filesystem::file_size(e.output));
  MESSAGE("10 s: packed ", codes_packed_bitrate(c) * 10 / 8, " bytes, coded ", bytes, " (file), ideal ", ideal_bytes);
  CHECK(bytes <= 1.03 * ideal_bytes);
  CHECK(bytes < codes_packed_bitrate(c) * 10 / 8);
  CHECK(e.coded_bitrate == doctest::Approx(bytes * 8 / 10));
  // The same codes as a format-2 file (packed, as vqddp wrote before)
  // decode to the same samples.
  write_codes_file_format2(out.file("ten2.codes.safetensors"), c);
  const std::vector<float> y = samples_of(decode_into(codec, e.output, out.file("dec3"), float_wav()).output);
  CHECK(y == samples_of(decode_into(codec, out.file("ten2.codes.safetensors"), out.file("dec2"), float_wav()).output));
  REQUIRE(y.size() == ten.size());
  // A flipped byte in the middle of the file lands in chunk 2 or 3: refused,
  // naming it; --skip-damaged decodes the rest, silence in its place.
  std::string bytes_of_file;
  {
    std::ifstream in(e.output, std::ios::binary);
    bytes_of_file.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes_of_file[bytes_of_file.size() / 2] ^= 0x10;
  const std::string damaged = out.file("damaged.codes");
  std::ofstream(damaged, std::ios::binary) << bytes_of_file;
  const std::string msg = error_of([&] { decode_into(codec, damaged, out.file("dec_bad"), float_wav()); });
  CHECK(msg.find(damaged) != std::string::npos);
  const bool second = msg.find("chunk 2 of 4 (frames 100-199, 3.20-6.40 s) is damaged") != std::string::npos;
  CHECK((second || msg.find("chunk 3 of 4 (frames 200-299, 6.40-9.60 s) is damaged") != std::string::npos));
  CHECK(msg.find("--skip-damaged") != std::string::npos);
  CHECK(!std::filesystem::exists(out.file("dec_bad")));
  DecodeOptions skip = float_wav();
  skip.skip_damaged = true;
  const CodingResult d = decode_into(codec, damaged, out.file("dec_skip"), skip);
  CHECK(d.damaged_chunks == 1);
  const std::vector<float> z = samples_of(d.output);
  REQUIRE(z.size() == y.size());
  const size_t from = (second ? 100 : 200) * 256, to = from + 100 * 256;
  for (size_t i = 0; i < z.size(); ++i) REQUIRE(z[i] == (i >= from && i < to ? 0.f : y[i]));
  // A damaged length (chunk 2's, shorter or longer; the last chunk's) loses
  // that chunk only: the next is found by its CRC, which covers its number.
  std::vector<int64_t> starts;
  {
    CodesReader reader(e.output);
    CodesReader::Chunk k;
    while (reader.next(k)) starts.push_back(k.offset);
  }
  REQUIRE(starts.size() == 4);
  for (auto [chunk, value] : {std::pair{1, 0x05}, std::pair{1, 0xff}, std::pair{3, 0x01}}) {
    CAPTURE(chunk);
    std::string b = bytes_of_file;
    b[bytes_of_file.size() / 2] ^= 0x10;  // undo the payload damage above
    b[static_cast<size_t>(starts[static_cast<size_t>(chunk)])] = static_cast<char>(value);
    std::ofstream(damaged, std::ios::binary | std::ios::trunc) << b;
    const std::vector<DamagedChunk> named = damaged_chunks(damaged);
    REQUIRE(named.size() == 1);
    CHECK(named[0].described.starts_with(fmt::format("chunk {} of 4", chunk + 1)));
    const CodingResult r = decode_into(codec, damaged, out.file(fmt::format("dec_len{}_{}", chunk, value)), skip);
    CHECK(r.damaged_chunks == 1);
    const std::vector<float> v = samples_of(r.output);
    REQUIRE(v.size() == y.size());
    const size_t lo = static_cast<size_t>(chunk) * 100 * 256, hi = std::min(v.size(), lo + 100 * 256);
    for (size_t i = 0; i < v.size(); ++i) REQUIRE(v[i] == (i >= lo && i < hi ? 0.f : y[i]));
  }
  // Chunk 3's length and chunk 4's payload damaged: chunk 4 is not found, so
  // the search runs to the file's last bytes (where a length must not be
  // read past the end); both are named, and the chunks before decode.
  {
    std::string b = bytes_of_file;
    b[bytes_of_file.size() / 2] ^= 0x10;
    b[static_cast<size_t>(starts[2])] = 0x05;
    b[b.size() - 2] ^= 0x10;  // the file ends in chunk 4's payload
    std::ofstream(damaged, std::ios::binary | std::ios::trunc) << b;
    const std::vector<DamagedChunk> named = damaged_chunks(damaged);
    REQUIRE(named.size() == 2);
    CHECK(named[0].described.starts_with("chunk 3 of 4"));
    CHECK(named[1].described.starts_with("chunk 4 of 4"));
    const CodingResult r = decode_into(codec, damaged, out.file("dec_two"), skip);
    CHECK(r.damaged_chunks == 2);
    const std::vector<float> v = samples_of(r.output);
    REQUIRE(v.size() == y.size());
    for (size_t i = 0; i < v.size(); ++i) REQUIRE(v[i] == (i >= 200 * 256 ? 0.f : y[i]));
  }
  // --bitrate picks the most layers whose real file is within it.
  EncodeOptions rate;
  rate.max_bitrate = e.coded_bitrate * 0.9;
  const CodingResult r = encode_into(codec, out.file("ten.wav"), out.file("rate"), rate);
  CHECK(r.layers == 2);
  CHECK(r.coded_bitrate <= rate.max_bitrate);
  CHECK(static_cast<double>(std::filesystem::file_size(r.output)) * 8 / 10 == doctest::Approx(r.coded_bitrate));
  rate.max_bitrate = 10;
  CHECK(error_of([&] { encode_into(codec, out.file("ten.wav"), out.file("rate2"), rate); })
            .find("no choice of layers codes within --bitrate 0.01 kbit/s") != std::string::npos);
}

namespace {

// The value of attribute `name` in the tag that starts at `at`.
std::string attribute(const std::string& html, size_t at, const std::string& name) {
  const size_t end = html.find('>', at), key = html.find(" " + name + "=\"", at);
  REQUIRE(key < end);
  const size_t begin = key + name.size() + 3;
  return html.substr(begin, html.find('"', begin) - begin);
}

// The start of every tag that begins with `open`.
std::vector<size_t> tags(const std::string& html, const std::string& open) {
  std::vector<size_t> at;
  for (size_t p = html.find(open); p != std::string::npos; p = html.find(open, p + 1)) at.push_back(p);
  return at;
}

// Every plot of a report has data; returns how many there are.
int checked_plots(const std::string& html) {
  int plots = 0;
  for (size_t at : tags(html, "<svg class=\"plot\"")) {
    CHECK(std::stoi(attribute(html, at, "data-series")) > 0);
    CHECK(std::stoi(attribute(html, at, "data-points")) > 0);
    ++plots;
  }
  CHECK(html.find("no data") == std::string::npos);
  CHECK(html.find("<script") == std::string::npos);
  return plots;
}

std::vector<uint8_t> base64_decoded(const std::string& text) {
  std::vector<uint8_t> out;
  uint32_t bits = 0;
  int have = 0;
  for (char c : text) {
    if (c == '=') break;
    const auto at = std::string("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/").find(c);
    REQUIRE(at != std::string::npos);
    bits = (bits << 6) | static_cast<uint32_t>(at);
    if ((have += 6) >= 8) out.push_back(static_cast<uint8_t>(bits >> (have -= 8)));
  }
  return out;
}

}  // namespace

TEST_CASE("the report of an audio run has data in every plot and players whose audio decodes") {
  const TrainedCodec& t = trained();
  const std::string html = render_report(t.dir.file("run"));
  // loss, lr, validation snr/STOI/log-mel/MR-STFT/mse, perplexity, codes
  // used, and one usage histogram per layer.
  CHECK(checked_plots(html) == 1 + 1 + 5 + 1 + 1 + 3);
  CHECK(html.find("validation STOI") != std::string::npos);
  TempDir tmp;
  int clips = 0;
  for (size_t at : tags(html, "<audio ")) {
    const std::string src = attribute(html, at, "src"), scheme = "data:audio/wav;base64,";
    REQUIRE(src.starts_with(scheme));
    const std::vector<uint8_t> bytes = base64_decoded(src.substr(scheme.size()));
    const std::string wav = tmp.file(std::to_string(clips) + ".wav");
    std::ofstream(wav, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    Audio a = read_audio(wav);
    CHECK(a.sample_rate == 8000);
    CHECK(a.samples.size() >= 256);
    ++clips;
  }
  CHECK(clips == 8);  // 4 clips, original and decoded
  CHECK(html.find("&quot;conv_codec&quot;") != std::string::npos);  // the config
  CHECK(std::filesystem::path(write_report(t.dir.file("run"))).filename() == "report.html");
}

TEST_CASE("the report of an image run has data in every plot and no audio") {
  TempDir dir;
  nlohmann::json j = {
      {"model", {{"type", "conv_vqvae"}, {"channels", {4, 8}}, {"latent_dim", 4}, {"sigmoid_output", true}}},
      {"quantizer", {{"type", "vq"}, {"codebook_size", 16}, {"decay", 0.9}}},
      {"data", {{"type", "fashion_mnist"}, {"sources", {{{"path", "unused"}}}}}},
      {"optimizer", {{"lr", 0.005}}},
      {"schedule", {{"batch_size", 8}, {"steps", 4}, {"log_every", 2}, {"validate_every", 2}}},
      {"distributed", {{"world_size", 1}, {"timeout_s", 20}}},
      {"run", {{"dir", dir.file("run")}, {"seed", 1}}}};
  Generator g(1, 0);
  Dataset d;
  d.sources = {rand_uniform({32, 64}, g)};
  d.weights = {1};
  d.validation = rand_uniform({8, 64}, g);
  d.example_dim = 64;
  d.description = "8x8 noise images";
  train(parse_config(j, "test"), d, TrainOptions{});
  const std::string html = render_report(dir.file("run"));
  CHECK(checked_plots(html) == 1 + 1 + 2 + 1 + 1 + 1);  // validation: no log-mel
  CHECK(html.find("<audio") == std::string::npos);
}

TEST_CASE("the report embeds only regular files inside the run directory, and huge values draw no NaN coordinates") {
  const TrainedCodec& t = trained();
  TempDir tmp;
  const std::filesystem::path run = tmp.file("run");
  std::filesystem::copy(t.dir.file("run"), run, std::filesystem::copy_options::recursive);
  CHECK_NOTHROW(render_report(run.string()));
  // A clip that is a link to a file the page must not carry.
  std::ofstream(tmp.file("secret.txt")) << "the secret";
  const std::filesystem::path clip = run / "clips" / "clip_0_original.wav";
  std::filesystem::remove(clip);
  std::filesystem::create_symlink(tmp.file("secret.txt"), clip);
  CHECK_THROWS_WITH_AS(render_report(run.string()), doctest::Contains(fmt::format("{}: is a symbolic link; the report "
                       "embeds only regular files", clip.string()).c_str()), Error);
  // The clips directory itself linked to one outside the run.
  std::filesystem::remove(clip);
  std::filesystem::rename(run / "clips", tmp.file("elsewhere"));
  std::filesystem::copy_file(tmp.file("elsewhere/clip_0_decoded.wav"), tmp.file("elsewhere/clip_0_original.wav"));
  std::filesystem::create_directory_symlink(tmp.file("elsewhere"), run / "clips");
  CHECK_THROWS_WITH_AS(render_report(run.string()), doctest::Contains("lies outside the run directory"), Error);
  std::filesystem::remove(run / "clips");
  // Metrics at +-1e308: their span overflows a double; they are left out of the plot.
  std::ofstream(run / "metrics.jsonl", std::ios::app) << "{\"step\": 7, \"loss\": 1e308}\n{\"step\": 8, \"loss\": -1e308}\n";
  const std::string html = render_report(run.string());
  CHECK(html.find("nan") == std::string::npos);
}

TEST_CASE("eval scores the codec and classic codecs on the same clip, from the bytes each stores") {
  const TrainedCodec& t = trained();
  Codec codec(t.checkpoint);
  const std::string clip = t.clips[3];  // held out, 5.2 s
  const EvalResult r = evaluate(codec, 3, {clip}, parse_classic_codecs("opus:8,codec2:3200"));
  REQUIRE(r.systems.size() == 3);
  CHECK(r.systems[0].name == "vqddp 3 of 3 layers");
  CHECK(r.systems[1].name == "opus 8 kbit/s");
  CHECK(r.systems[2].name == "codec2 3200");
  CHECK(r.clips == std::vector<std::string>{clip});
  CHECK(r.left_out.empty());
  const std::vector<float> x = samples_of(clip);
  const double seconds = static_cast<double>(x.size()) / 8000;
  // Ours: the bytes of the file encode writes, scored on what decode gives.
  TempDir out;
  CodingResult e = encode_into(codec, clip, out.file("codes"), EncodeOptions{});
  CodingResult d = decode_into(codec, e.output, out.file("wav"), float_wav());
  const std::vector<float> y = samples_of(d.output);
  const EvalScores& ours = r.systems[0].clips.at(0);
  CHECK(ours.bytes == static_cast<double>(std::filesystem::file_size(e.output)));
  CHECK(ours.kbps == ours.bytes * 8 / seconds / 1000);
  CHECK(ours.seconds == seconds);
  CHECK(ours.stoi == stoi(x, y, 8000));
  CHECK(ours.estoi == stoi(x, y, 8000, true));
  CHECK(ours.snr_db == snr_db(x, y));
  CHECK(ours.si_sdr_db == si_sdr_db(x, y));
  const int64_t n = static_cast<int64_t>(x.size());
  const SumCount mel = log_mel_l1(held_out_log_mel(8000), from_vector(x, {1, n}), from_vector(y, {1, n}));
  CHECK(ours.log_mel_l1 == mel.sum / mel.count);
  CHECK(ours.coding_seconds > 0);
  // A classic codec: its packets' bytes, scored on its aligned output.
  const ClassicCoded opus = code_classic(parse_classic_codec("opus:8"), x, 8000);
  const EvalScores& o = r.systems[1].clips.at(0);
  CHECK(o.bytes == static_cast<double>(opus.bytes));
  CHECK(o.kbps == o.bytes * 8 / seconds / 1000);
  CHECK(o.kbps > 6);
  CHECK(o.kbps < 10);
  CHECK(o.stoi == stoi(x, opus.samples, 8000));
  CHECK(o.snr_db == snr_db(x, opus.samples));
  // Codec 2 keeps no waveform (its SNR is below 0 dB), yet is intelligible.
  const EvalScores& c2 = r.systems[2].clips.at(0);
  CHECK(c2.kbps > 3.1);
  CHECK(c2.kbps < 3.4);
  CHECK(c2.snr_db < 0);
  CHECK(c2.stoi > 0.6);
  // One clip: the totals are its figures; the JSON has them all.
  CHECK(r.systems[1].total.stoi == o.stoi);
  CHECK(r.systems[1].total.kbps == o.kbps);
  const nlohmann::json j = nlohmann::json::parse(eval_json(r));
  CHECK(j["systems"][0]["clips"][0]["stoi"].get<double>() == ours.stoi);
  CHECK(j["systems"][2]["total"]["kbps"].get<double>() == c2.kbps);
  CHECK(j["clips"][0] == clip);
  CHECK(eval_table(r).find("codec2 3200") != std::string::npos);
}

TEST_CASE("eval codes Codec 2's modes one after the other, every other system side by side") {
  // libcodec2 keeps one process-wide generator for its decoders' phases:
  // two modes at once made its figures depend on the threads' timing.
  using Groups = std::vector<std::vector<size_t>>;
  CHECK(eval_system_groups({}) == Groups{{0}});
  CHECK(eval_system_groups(parse_classic_codecs("opus:8,codec2:3200,opus:6,codec2:1300")) ==
        Groups{{0}, {1}, {3}, {2, 4}});
  CHECK(eval_system_groups(parse_classic_codecs("codec2:1300,codec2:3200")) == Groups{{0}, {1, 2}});
}

TEST_CASE("eval --bitrate keeps on each clip the layers encode --bitrate keeps: the most whose file is within it") {
  const TrainedCodec& t = trained();
  Codec codec(t.checkpoint);
  const std::string clip = t.clips[3];
  TempDir out;
  const CodingResult all = encode_into(codec, clip, out.file("all"), EncodeOptions{});
  // Just below the file of all 3 layers.
  EncodeOptions below;
  below.max_bitrate = all.coded_bitrate * 0.99;
  const CodingResult e = encode_into(codec, clip, out.file("below"), below);
  REQUIRE(e.layers < 3);
  const EvalResult r = evaluate(codec, 3, {clip}, {}, false, below.max_bitrate);
  const EvalScores& ours = r.systems.at(0).clips.at(0);
  CHECK(ours.layers == e.layers);
  CHECK(ours.bytes == static_cast<double>(e.bytes));
  CHECK(ours.kbps * 1000 <= below.max_bitrate);
  CHECK(r.systems[0].name == fmt::format("vqddp <= {:.2f} kbit/s ({} of 3 layers)", below.max_bitrate / 1000, e.layers));
  // And it is what --layers gives.
  const EvalResult fixed = evaluate(codec, e.layers, {clip}, {});
  CHECK(fixed.systems[0].clips.at(0).stoi == ours.stoi);
  CHECK(fixed.systems[0].clips.at(0).bytes == ours.bytes);
  CHECK(fixed.systems[0].total.layers == e.layers);
  // Nothing within it: refused, naming the clip and the choices.
  const std::string msg = error_of([&] { evaluate(codec, 3, {clip}, {}, false, 10); });
  CHECK(msg.find("eval: " + clip + ": no choice of layers codes within --bitrate 0.01 kbit/s") != std::string::npos);
}

TEST_CASE("SI-SDR does not depend on the output's scale; SNR does") {
  std::vector<float> x(8000), half(8000), noisy(8000);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<float>(std::sin(0.05 * static_cast<double>(i)));
    half[i] = 0.5f * x[i];
  }
  CHECK(snr_db(x, half) == doctest::Approx(20 * std::log10(2.0)).epsilon(1e-6));
  CHECK(si_sdr_db(x, half) > 100);
  // Noise orthogonal to x (a cosine over whole periods) at a tenth of its
  // amplitude: 20 dB either way.
  const double w = 2 * std::numbers::pi * 40 / 8000;
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<float>(std::sin(w * static_cast<double>(i)));
    noisy[i] = x[i] + 0.1f * static_cast<float>(std::cos(w * static_cast<double>(i)));
  }
  CHECK(snr_db(x, noisy) == doctest::Approx(20).epsilon(1e-4));
  CHECK(si_sdr_db(x, noisy) == doctest::Approx(20).epsilon(1e-4));
  CHECK_THROWS_WITH_AS(snr_db(x, std::vector<float>(3)), doctest::Contains("an output of 3"), Error);
  CHECK_THROWS_WITH_AS(si_sdr_db(std::vector<float>(4, 0.f), std::vector<float>(4, 1.f)),
                       doctest::Contains("the reference is silent"), Error);
}

TEST_CASE("eval refuses, naming it, a clip too short for STOI, no clips and layers the codec lacks; held-out lists leave such a clip out") {
  const TrainedCodec& t = trained();
  Codec codec(t.checkpoint);
  TempDir dir;
  const std::string short_clip = dir.file("short.wav");
  write_audio(short_clip, std::vector<float>(1600, 0.1f), 8000, AudioEncoding::wav16);  // 0.2 s
  std::string msg = error_of([&] { evaluate(codec, 3, {short_clip}, {}); });
  CHECK(msg.find(short_clip) != std::string::npos);
  CHECK(msg.find("shorter than one STOI segment") != std::string::npos);
  msg = error_of([&] { evaluate(codec, 3, {}, {}); });
  CHECK(msg.find("no audio files") != std::string::npos);
  // More layers than the codec has: refused before a code is read past a row.
  msg = error_of([&] { evaluate(codec, 4, {t.clips[3]}, {}); });
  CHECK(msg.find("eval: --layers 4 is not in 1..3") != std::string::npos);
  const std::string empty_clip = dir.file("empty.wav");
  write_audio(empty_clip, std::vector<float>(1, 0.f), 8000, AudioEncoding::wav16);
  msg = error_of([&] { evaluate(codec, 3, {empty_clip}, {}); });
  CHECK(msg.find(empty_clip) != std::string::npos);
  msg = error_of([&] { parse_classic_codecs("opus:8,codec2:3000"); });
  CHECK(msg.find("codec2:3000") != std::string::npos);
  const EvalResult r = evaluate(codec, 2, {short_clip, t.clips[3]}, {}, true);
  CHECK(r.left_out == std::vector<std::string>{short_clip});
  CHECK(r.clips == std::vector<std::string>{t.clips[3]});
  CHECK(r.systems.at(0).name == "vqddp 2 of 3 layers");
  CHECK(r.systems.at(0).clips.size() == 1);
}
