// A causal codec coding a live stream (train/codec_stream.h) on one core:
// its algorithmic latency (when a frame's codes come out, pushing a sample
// at a time), encode + decode speed against real time at several push
// sizes, and its memory over a long stream (the state's bytes and the
// process's resident size at each tenth of it).
//
// usage: bench_codec_stream [SECONDS (default 60)] [CONFIG (default
// examples/speech_codec_causal.json)]. The weights are the config's
// initial ones after one training step (k-means init of the codebooks):
// the speed and memory of coding do not depend on what they learned.
// Not a test: it prints figures and asserts nothing about time.
#include <fmt/format.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "comm/single.h"
#include "engine/cpu/parallel.h"
#include "train/codec_stream.h"
#include "train/config.h"
#include "train/model.h"

using namespace vqddp;

namespace {

long rss_kib() {  // the resident size now (VmRSS), not the peak
  std::ifstream f("/proc/self/status");
  std::string key;
  long value = 0;
  while (f >> key) {
    if (key == "VmRSS:") {
      f >> value;
      return value;
    }
    f.ignore(4096, '\n');
  }
  return 0;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::stod(argv[1]) : 60.0;
  const std::string path = argc > 2 ? argv[2] : std::string("examples/speech_codec_causal.json");
  cpu_set_threads(1);  // one core
  Config cfg = load_config(path);
  const int rate = 8000;
  CodecModel model(cfg.model, cfg.quantizer, cfg.data.frame, 1, rate);
  {
    SingleCommunicator comm;
    Generator g(2, 0);
    model.forward(mul(rand_normal({16, cfg.data.frame}, g), 0.1f), comm);  // k-means init
  }
  model.eval();
  const int64_t hop = model.hop();
  fmt::print("{}: hop {} samples ({:.2f} ms at {} Hz), {} layers, one core\n", path, hop, 1000.0 * hop / rate, rate,
             model.num_layers());

  // Latency: a sample at a time; frame t's codes come out at sample k.
  {
    EncoderStream enc(model);
    DecoderStream dec(model);
    Generator g(3, 0);
    std::vector<float> x = mul(rand_normal({hop * 50}, g), 0.1f).to_vector<float>();
    int64_t frames = 0, worst = 0, decoded_late = 0;
    for (int64_t k = 0; k < static_cast<int64_t>(x.size()); ++k) {
      Tensor codes = enc.push(&x[k], 1);
      for (int64_t f = 0; f < codes.size(0); ++f, ++frames)
        worst = std::max(worst, k - frames * hop);  // from the frame's first sample's arrival
      if (codes.size(0) > 0 && static_cast<int64_t>(dec.push(codes).size()) != codes.size(0) * hop) ++decoded_late;
    }
    fmt::print("latency: a frame's codes come out with its last sample, {} samples after its first ({:.2f} ms); "
               "its samples come out of the decoder with its codes ({} frames of {} late)\n",
               worst, 1000.0 * worst / rate, decoded_late, frames);
  }

  // Speed: encode + decode of `seconds` of audio, pushed in pieces of each size.
  Generator g(4, 0);
  const int64_t block = rate * 10;  // 10 s of audio, pushed again and again
  std::vector<float> audio = mul(rand_normal({block}, g), 0.1f).to_vector<float>();
  for (int64_t piece : {hop, 4 * hop, 16 * hop, int64_t{rate}}) {
    EncoderStream enc(model);
    DecoderStream dec(model);
    const int64_t total = static_cast<int64_t>(std::min(seconds, 20.0) * rate);
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t at = 0; at < total; at += piece) {
      const int64_t n = std::min(piece, total - at);
      dec.push(enc.push(&audio[at % block], std::min(n, block - at % block)));
    }
    const double s = seconds_since(t0), audio_s = static_cast<double>(total) / rate;
    fmt::print("pushes of {:5} samples ({:6.1f} ms): {:7.1f}x real time encode + decode ({:.1f} us a frame)\n",
               piece, 1000.0 * piece / rate, audio_s / s, 1e6 * s / (static_cast<double>(total) / hop));
  }

  // Memory over the whole stream, 20 ms pushes.
  EncoderStream enc(model);
  DecoderStream dec(model);
  const int64_t total = static_cast<int64_t>(seconds * rate), piece = 4 * hop;
  const long before = rss_kib();
  int64_t next_report = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t at = 0; at < total; at += piece) {
    if (at >= next_report) {
      fmt::print("memory at {:7.1f} s of the stream: resident {} KiB, state {} + {} bytes\n",
                 static_cast<double>(at) / rate, rss_kib(), enc.state_bytes(), dec.state_bytes());
      next_report += total / 10;
    }
    dec.push(enc.push(&audio[at % block], std::min(piece, total - at)));
  }
  fmt::print("memory at the end ({:.0f} s, coded in {:.1f} s): resident {} KiB ({:+} KiB from the start), state {} + "
             "{} bytes\n", seconds, seconds_since(t0), rss_kib(), rss_kib() - before, enc.state_bytes(),
             dec.state_bytes());
  return 0;
}
