// What the memory benches share: a generated corpus of 16-bit WAVs at 8 kHz,
// and a run in a child process whose peak resident set the kernel reports
// (wait4), so each measurement starts from a fresh process.
#pragma once

#include <fmt/format.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace vqddp::bench {

inline void write_wav(const std::string& path, const std::vector<int16_t>& pcm) {
  auto le32 = [](uint32_t v) { return std::string{char(v), char(v >> 8), char(v >> 16), char(v >> 24)}; };
  auto le16 = [](uint16_t v) { return std::string{char(v), char(v >> 8)}; };
  const uint32_t bytes = static_cast<uint32_t>(pcm.size() * 2);
  std::string h = "RIFF" + le32(36 + bytes) + "WAVEfmt " + le32(16) + le16(1) + le16(1) + le32(8000) + le32(16000) +
                  le16(2) + le16(16) + "data" + le32(bytes);
  std::ofstream f(path, std::ios::binary);
  f.write(h.data(), static_cast<std::streamsize>(h.size()));
  f.write(reinterpret_cast<const char*>(pcm.data()), bytes);
}

// `files` WAVs of `seconds` at 8 kHz in `dir` (00000.wav, ...): a tone and
// noise, each file its own (a 64-bit LCG seeded by `seed` + the file's
// number). Returns the corpus's size in GB.
inline double write_corpus(const std::string& dir, int files, double seconds, uint64_t seed = 0) {
  std::filesystem::create_directories(dir);
  std::vector<int16_t> pcm(static_cast<size_t>(seconds * 8000));
  for (int i = 0; i < files; ++i) {
    uint64_t x = 0x9E3779B97F4A7C15ull * (seed + static_cast<uint64_t>(i) + 1);
    for (size_t t = 0; t < pcm.size(); ++t) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      pcm[t] = static_cast<int16_t>(static_cast<int>((t * (i % 13 + 3)) % 200) * 40 - 4000 +
                                    static_cast<int>(x >> 52) - 2048);
    }
    write_wav(fmt::format("{}/{:05}.wav", dir, i), pcm);
  }
  return static_cast<double>(files) * (44 + 2.0 * static_cast<double>(pcm.size())) / 1e9;
}

// Runs `body` in a child process; its peak resident set in MiB and the wall
// seconds. A child that throws or fails ends the bench.
template <class F>
std::pair<double, double> in_child(F&& body) {
  const auto t0 = std::chrono::steady_clock::now();
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    try {
      body();
      std::fflush(stdout);
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
    fmt::print(stderr, "the child run failed\n");
    std::exit(1);
  }
  return {static_cast<double>(usage.ru_maxrss) / 1024,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

}  // namespace vqddp::bench
