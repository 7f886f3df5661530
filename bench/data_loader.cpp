// The streaming audio loader alone: rows of a generated corpus of 16-bit
// FLAC at 16 kHz, read as windows resampled to 8 kHz (the main job's rate),
// in the sampler's order on one thread. Prints the real-time factor per
// core (seconds of audio delivered per second of wall time) against the
// baseline of decoding the same files whole (AudioReader, no seeking) in
// the same process. Usage: bench_data_loader [FILES] [SECONDS_PER_FILE] [FRAME]
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>

#include "data/audio.h"
#include "data/audio_windows.h"
#include "engine/core/random.h"
#include "tests/engine/tmpdir.h"

using namespace vqddp;

int main(int argc, char** argv) {
  const int files = argc > 1 ? std::atoi(argv[1]) : 40;
  const double seconds = argc > 2 ? std::atof(argv[2]) : 10;
  const int64_t frame = argc > 3 ? std::atoll(argv[3]) : 1600;
  test::TempDir dir;
  Generator g(1, 0);
  std::vector<AudioClip> clips;
  for (int i = 0; i < files; ++i) {
    std::vector<float> s(static_cast<size_t>(seconds * 16000));
    for (size_t t = 0; t < s.size(); ++t)
      s[t] = 0.3f * std::sin(0.01f * static_cast<float>((i % 7 + 1) * t)) + 0.05f * (g.uniform() - 0.5f);
    const std::string p = dir.file(fmt::format("{:05}.flac", i));
    write_audio(p, s, 16000, AudioEncoding::flac16);
    clips.push_back(audio_clip(p));
  }
  AudioWindows windows(clips, 8000, frame);
  const int64_t rows = windows.rows();
  IndexPermutation order(static_cast<uint64_t>(rows), 3, 0);
  std::vector<float> out(static_cast<size_t>(frame));
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < rows; ++i) windows.read(static_cast<int64_t>(order(static_cast<uint64_t>(i))), out.data());
  const double streamed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  t0 = std::chrono::steady_clock::now();
  int64_t samples = 0;
  for (const AudioClip& c : clips) samples += static_cast<int64_t>(read_audio(c.path, 8000).samples.size());
  const double whole = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double audio = static_cast<double>(rows * frame) / 8000;
  fmt::print("corpus: {} FLAC files of {:.0f} s at 16 kHz, read as {} windows of {} samples at 8 kHz\n", files, seconds,
             rows, frame);
  fmt::print("streamed windows, shuffled, 1 thread: {:.3f} s for {:.0f} s of audio = {:.0f}x real time per core\n",
             streamed, audio, audio / streamed);
  fmt::print("whole files, in order (baseline):      {:.3f} s for {:.0f} s of audio = {:.0f}x real time per core\n",
             whole, static_cast<double>(samples) / 8000, static_cast<double>(samples) / 8000 / whole);
  fmt::print("ratio streamed / whole: {:.2f}\n", (audio / streamed) / (static_cast<double>(samples) / 8000 / whole));
}
