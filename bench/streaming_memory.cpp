// Peak memory of training on a streamed corpus against its size: the main
// job (examples/speech_codec.json, 4 thread ranks) for a few steps on a
// generated corpus of SMALL files and on one of LARGE files (16-bit WAV at
// 8 kHz, SECONDS each, every file its own noise: 20,000 files of 16 s are
// 5.1 GB), each run in a child process whose peak resident set the kernel
// reports (wait4). Run from the project root. Usage:
//   bench_streaming_memory [SMALL=200] [LARGE=20000] [SECONDS=16] [STEPS=30]
#include <fmt/format.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "tests/engine/tmpdir.h"
#include "train/config.h"
#include "train/trainer.h"

using namespace vqddp;

namespace {

void write_wav(const std::string& path, const std::vector<int16_t>& pcm) {
  auto le32 = [](uint32_t v) { return std::string{char(v), char(v >> 8), char(v >> 16), char(v >> 24)}; };
  auto le16 = [](uint16_t v) { return std::string{char(v), char(v >> 8)}; };
  const uint32_t bytes = static_cast<uint32_t>(pcm.size() * 2);
  std::string h = "RIFF" + le32(36 + bytes) + "WAVEfmt " + le32(16) + le16(1) + le16(1) + le32(8000) + le32(16000) +
                  le16(2) + le16(16) + "data" + le32(bytes);
  std::ofstream f(path, std::ios::binary);
  f.write(h.data(), static_cast<std::streamsize>(h.size()));
  f.write(reinterpret_cast<const char*>(pcm.data()), bytes);
}

// `files` WAVs of `seconds` at 8 kHz in `dir`: a tone and noise, each file
// its own (a 64-bit LCG seeded by the file's number).
double write_corpus(const std::string& dir, int files, double seconds) {
  std::filesystem::create_directories(dir);
  std::vector<int16_t> pcm(static_cast<size_t>(seconds * 8000));
  for (int i = 0; i < files; ++i) {
    uint64_t x = 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(i) + 1);
    for (size_t t = 0; t < pcm.size(); ++t) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      pcm[t] = static_cast<int16_t>(static_cast<int>((t * (i % 13 + 3)) % 200) * 40 - 4000 +
                                    static_cast<int>(x >> 52) - 2048);
    }
    write_wav(fmt::format("{}/{:05}.wav", dir, i), pcm);
  }
  return static_cast<double>(files) * (44 + 2.0 * static_cast<double>(pcm.size())) / 1e9;
}

// Trains in a child; its peak resident set in MiB and wall seconds.
std::pair<double, double> train_child(const std::string& corpus, const std::string& run_dir, int steps) {
  auto t0 = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    try {
      nlohmann::json j = load_config_json("examples/speech_codec.json");
      j["data"]["sources"] = {{{"path", corpus}}};
      j["data"]["index_dir"] = run_dir + "-index";
      j["schedule"]["steps"] = steps;
      j["schedule"]["validate_every"] = 0;
      j["run"]["dir"] = run_dir;
      Config cfg = parse_config(j, "examples/speech_codec.json");
      TrainOptions o;
      o.print = false;
      o.overwrite = true;
      train(cfg, load_dataset(cfg.data), o);
    } catch (const std::exception& e) {
      fmt::print(stderr, "{}\n", e.what());
      _exit(1);
    }
    _exit(0);
  }
  int status = 0;
  rusage usage{};
  wait4(pid, &status, 0, &usage);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fmt::print(stderr, "the training child failed\n");
    std::exit(1);
  }
  return {static_cast<double>(usage.ru_maxrss) / 1024,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

}  // namespace

int main(int argc, char** argv) {
  const int small = argc > 1 ? std::atoi(argv[1]) : 200, large = argc > 2 ? std::atoi(argv[2]) : 20000;
  const double seconds = argc > 3 ? std::atof(argv[3]) : 16;
  const int steps = argc > 4 ? std::atoi(argv[4]) : 30;
  test::TempDir dir;
  const double small_gb = write_corpus(dir.file("small"), small, seconds);
  const double large_gb = write_corpus(dir.file("large"), large, seconds);
  const auto [small_mib, small_s] = train_child(dir.file("small"), dir.file("run_small"), steps);
  const auto [large_mib, large_s] = train_child(dir.file("large"), dir.file("run_large"), steps);
  fmt::print("main job, {} steps, 4 thread ranks, streamed 16-bit WAV at 8 kHz ({:.0f} s per file):\n", steps, seconds);
  fmt::print("  {:6} files ({:.2f} GB): peak RSS {:.1f} MiB, {:.1f} s\n", small, small_gb, small_mib, small_s);
  fmt::print("  {:6} files ({:.2f} GB): peak RSS {:.1f} MiB, {:.1f} s\n", large, large_gb, large_mib, large_s);
  fmt::print("ratio of peak RSS, large / small: {:.3f}\n", large_mib / small_mib);
}
