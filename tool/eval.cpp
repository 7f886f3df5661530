#include "tool/eval.h"

#include <fmt/format.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <system_error>
#include <thread>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/audio.h"
#include "engine/core/error.h"
#include "engine/core/output_file.h"
#include "engine/core/shown.h"
#include "engine/cpu/parallel.h"
#include "train/codec.h"
#include "train/codes_file.h"
#include "train/spectral.h"
#include "train/stoi.h"

namespace vqddp {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// A private directory for the codes files eval writes and reads back,
// removed with everything in it when eval ends (also on an error).
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "vqddp-eval-XXXXXX").string();
    VQDDP_CHECK(::mkdtemp(pattern.data()) != nullptr, "eval: cannot make a scratch directory {}", pattern);
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Our codec on one clip, as encode and decode would (train/codec.h: the
// same codes file, chunks of 256 frames, --bitrate by the file's real
// size); the codes go through that file (written, its size taken, read
// back) and the decoded signal is cut back to the clip's length.
struct Coded {
  std::vector<float> samples;
  int64_t bytes = 0;
  int layers = 0;
  double seconds = 0;
};

constexpr int64_t kPieceFrames = 32;  // frames coded at a time: equal pieces reuse the allocator's blocks (fewer page faults than 256)

Coded code_ours(const Codec& codec, int layers, double max_bitrate, const std::vector<float>& x,
                const std::string& codes_path, const std::string& clip) {
  const auto start = Clock::now();
  const int64_t f = codec.frame(), n = static_cast<int64_t>(x.size());
  CodesFile c = codec.codes_for(layers, std::filesystem::path(clip).filename().string());
  Codec::Pieces pieces;  // a causal codec: the clip coded as one stream
  for (int64_t at = 0; at < n; at += kPieceFrames * f)
    codec.append_codes(std::vector<float>(x.begin() + at, x.begin() + std::min(n, at + kPieceFrames * f)), c, pieces);
  const std::string bytes = codec.file_within(c, max_bitrate, "eval: " + shown(clip));
  {
    OutputFile file(codes_path);
    file.write(bytes.data(), bytes.size());
    file.commit();
  }
  Coded out;
  struct stat st {};
  VQDDP_CHECK(::stat(codes_path.c_str(), &st) == 0, "eval: cannot stat {}", codes_path);
  out.bytes = static_cast<int64_t>(st.st_size);
  out.layers = static_cast<int>(c.layers);
  const CodesFile back = read_codes_file(codes_path, &codec.code_model());
  VQDDP_CHECK(back.codes == c.codes, "eval: {}: the codes read back differ from those written", codes_path);
  const int64_t frames = back.frames(), row = back.tokens * back.layers;
  for (int64_t at = 0; at < frames; at += kPieceFrames) {
    const std::vector<float> y =
        codec.decode_frames(back.codes.data() + at * row, std::min(kPieceFrames, frames - at), back.layers, pieces);
    out.samples.insert(out.samples.end(), y.begin(), y.end());
  }
  out.samples.resize(static_cast<size_t>(n));
  out.seconds = since(start);
  return out;
}

// f(0) .. f(n - 1) on up to as many threads as the machine has cores. The
// first task's error (in task order, so the message does not depend on
// timing) is rethrown as an Error worded by `name`.
void for_each_concurrently(size_t n, const std::function<void(size_t)>& f,
                           const std::function<std::string(const std::string&)>& name) {
  std::vector<std::string> errors(n);
  std::vector<char> failed(n, 0);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t t; (t = next.fetch_add(1)) < n;) {
      try {
        f(t);
      } catch (const std::exception& e) {
        errors[t] = e.what();
        failed[t] = 1;
      } catch (...) {
        errors[t] = "an unknown error";
        failed[t] = 1;
      }
    }
  };
  const size_t threads = std::min<size_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // fewer threads: slower, the same results
    }
  }
  work();
  for (std::thread& t : pool) t.join();
  for (size_t t = 0; t < n; ++t)
    if (failed[t]) VQDDP_THROW("{}", name(errors[t]));
}

// The spectral distances as validation computes them (train/validation.cpp),
// for one clip, with the clip's own features computed once for every
// system.
struct Spectral {
  LogMel mel;
  std::vector<Stft> stfts;
  std::vector<float> mel_x;
  std::vector<StftReference> stfts_x;
  Spectral(int rate, const std::vector<float>& x) : mel(held_out_log_mel(rate)) {
    const int64_t n = static_cast<int64_t>(x.size());
    mel_x = mel.host(x.data(), n);
    for (auto [n_fft, hop] : kStftLossResolutions) {
      stfts.emplace_back(n_fft, hop);
      stfts_x.push_back(stft_reference(stfts.back(), x.data(), n));
    }
  }
};

EvalScores score(const Spectral& spectral, const StoiReference& intelligibility, const std::vector<float>& x,
                 const std::vector<float>& y, int rate, int64_t bytes, double coding_seconds) {
  EvalScores s;
  s.seconds = static_cast<double>(x.size()) / rate;
  s.bytes = static_cast<double>(bytes);
  s.kbps = s.bytes * 8 / s.seconds / 1000;
  s.coding_seconds = coding_seconds;
  s.rtf = coding_seconds / s.seconds;
  const StoiReference::Scores both = intelligibility.score(y);
  s.stoi = both.stoi;
  s.estoi = both.estoi;
  s.si_sdr_db = si_sdr_db(x, y);
  s.snr_db = snr_db(x, y);
  const int64_t n = static_cast<int64_t>(y.size());
  const SumCount mel = log_mel_l1_against(spectral.mel, spectral.mel_x, y.data(), n);
  s.log_mel_l1 = mel.sum / mel.count;
  for (size_t r = 0; r < spectral.stfts.size(); ++r) {
    const SumCount d = stft_distance_against(spectral.stfts[r], spectral.stfts_x[r], y.data(), n);
    s.stft_distance += d.sum / d.count / static_cast<double>(spectral.stfts.size());
  }
  return s;
}

// A system's row: the clips' mean scores; kbit/s and the real-time factor
// as totals over totals.
EvalScores summarize(const std::vector<EvalScores>& clips) {
  EvalScores t;
  for (const EvalScores& c : clips) {
    t.seconds += c.seconds;
    t.bytes += c.bytes;
    t.coding_seconds += c.coding_seconds;
    t.stoi += c.stoi;
    t.estoi += c.estoi;
    t.si_sdr_db += c.si_sdr_db;
    t.snr_db += c.snr_db;
    t.log_mel_l1 += c.log_mel_l1;
    t.stft_distance += c.stft_distance;
  }
  const double n = static_cast<double>(clips.size());
  for (const EvalScores& c : clips) t.layers += c.layers;
  for (double* v : {&t.stoi, &t.estoi, &t.si_sdr_db, &t.snr_db, &t.log_mel_l1, &t.stft_distance, &t.layers}) *v /= n;
  t.kbps = t.bytes * 8 / t.seconds / 1000;
  t.rtf = t.coding_seconds / t.seconds;
  return t;
}

nlohmann::json scores_json(const EvalScores& s) {
  return {{"seconds", s.seconds}, {"bytes", s.bytes}, {"kbps", s.kbps}, {"stoi", s.stoi}, {"estoi", s.estoi},
          {"si_sdr_db", s.si_sdr_db}, {"snr_db", s.snr_db}, {"log_mel_l1", s.log_mel_l1},
          {"stft_distance", s.stft_distance}, {"coding_seconds", s.coding_seconds}, {"rtf", s.rtf},
          {"layers", s.layers}};
}

}  // namespace

std::vector<std::vector<size_t>> eval_system_groups(const std::vector<ClassicCodecSpec>& against) {
  std::vector<std::vector<size_t>> groups{{0}};
  std::vector<size_t> codec2;
  for (size_t k = 0; k < against.size(); ++k)
    if (against[k].name == "codec2") codec2.push_back(k + 1);
    else groups.push_back({k + 1});
  if (!codec2.empty()) groups.push_back(codec2);
  return groups;
}

double si_sdr_db(const std::vector<float>& x, const std::vector<float>& y) {
  VQDDP_CHECK(x.size() == y.size(), "SI-SDR: a reference of {} samples and an output of {}", x.size(), y.size());
  double xy = 0, xx = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    xy += double(x[i]) * y[i];
    xx += double(x[i]) * x[i];
  }
  VQDDP_CHECK(xx > 0, "SI-SDR: the reference is silent");
  const double a = xy / xx;
  double target = 0, noise = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double t = a * x[i], e = t - y[i];
    target += t * t;
    noise += e * e;
  }
  return 10 * std::log10(std::max(target, 1e-300) / std::max(noise, 1e-300));
}

double snr_db(const std::vector<float>& x, const std::vector<float>& y) {
  VQDDP_CHECK(x.size() == y.size(), "SNR: a reference of {} samples and an output of {}", x.size(), y.size());
  double signal = 0, error = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    signal += double(x[i]) * x[i];
    error += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
  }
  return 10 * std::log10(std::max(signal, 1e-300) / std::max(error, 1e-300));
}

EvalResult evaluate(const Codec& codec, int layers, const std::vector<std::string>& clips,
                    const std::vector<ClassicCodecSpec>& against, bool skip_unscorable, double max_bitrate) {
  VQDDP_CHECK(!clips.empty(), "eval: no audio files given");
  codec.check_layers(layers, "eval");
  EvalResult r;
  r.sample_rate = codec.sample_rate();
  const size_t q = codec.layer_sizes().size();
  r.systems.push_back({max_bitrate > 0 ? fmt::format("vqddp <= {:.2f} kbit/s", max_bitrate / 1000)
                                       : fmt::format("vqddp {} of {} layers", layers, q), {}, {}});
  for (const ClassicCodecSpec& spec : against) r.systems.push_back({spec.label(), {}, {}});
  const int rate = codec.sample_rate();
  ScratchDir scratch;
  // The systems run side by side (below), so our codec's kernels take their
  // share of the cores, not all of them: more threads than cores only
  // switched between them.
  const CpuShareScope share(static_cast<int>(r.systems.size()));
  const std::vector<std::vector<size_t>> groups = eval_system_groups(against);
  for (size_t i = 0; i < clips.size(); ++i) {
    const std::string& clip = clips[i];
    const std::vector<float> x = read_audio(clip, rate).samples;
    // Whether a clip has a STOI segment depends on the clean signal alone.
    VQDDP_CHECK(!x.empty(), "eval: {}: no audio in it", shown(clip));
    const StoiReference intelligibility(x, rate);
    if (!intelligibility.scorable()) {
      VQDDP_CHECK(skip_unscorable, "eval: {}: {}", shown(clip), intelligibility.why());
      r.left_out.push_back(clip);
      continue;
    }
    r.clips.push_back(clip);
    const int64_t min_samples = std::max<int64_t>(kStftLossResolutions.back().first, 256);
    VQDDP_CHECK(static_cast<int64_t>(x.size()) >= min_samples, "eval: {}: {} samples at {} Hz; the spectral "
                "measures need at least {}", shown(clip), x.size(), rate, min_samples);
    const Spectral spectral(rate, x);
    // The systems code and score the clip side by side, one thread each
    // up to the machine's cores: the classic codecs and the scores are
    // single-threaded (our codec's kernels share the engine's pool).
    std::vector<EvalScores> row(r.systems.size());
    for_each_concurrently(groups.size(), [&](size_t g) {
      for (const size_t s : groups[g]) {
        if (s == 0) {
          const Coded ours =
              code_ours(codec, layers, max_bitrate, x, scratch.path() + fmt::format("/{}.codes", i), clip);
          row[s] = score(spectral, intelligibility, x, ours.samples, rate, ours.bytes, ours.seconds);
          row[s].layers = ours.layers;
        } else {
          const ClassicCoded coded = code_classic(against[s - 1], x, rate);
          row[s] = score(spectral, intelligibility, x, coded.samples, rate, coded.bytes, coded.seconds);
        }
      }
    }, [&](const std::string& what) { return fmt::format("eval: {}: {}", shown(clip), what); });
    for (size_t s = 0; s < row.size(); ++s) r.systems[s].clips.push_back(row[s]);
  }
  VQDDP_CHECK(!r.clips.empty(), "eval: all {} clips are too short or quiet for one STOI segment (384 ms of speech)",
              clips.size());
  for (EvalSystem& s : r.systems) s.total = summarize(s.clips);
  if (max_bitrate > 0) {  // the layers the files within it took
    const auto [lo, hi] = std::minmax_element(r.systems[0].clips.begin(), r.systems[0].clips.end(),
                                              [](const EvalScores& a, const EvalScores& b) { return a.layers < b.layers; });
    r.systems[0].name += lo->layers == hi->layers ? fmt::format(" ({} of {} layers)", lo->layers, q)
                                                  : fmt::format(" ({}-{} of {} layers)", lo->layers, hi->layers, q);
  }
  return r;
}

std::string eval_table(const EvalResult& r) {
  std::string out = fmt::format("{} clips, {:.1f} s of audio at {} Hz{}\n", r.clips.size(),
                                r.systems.empty() ? 0.0 : r.systems[0].total.seconds, r.sample_rate,
                                r.left_out.empty() ? "" : fmt::format(" ({} left out: too short or quiet for STOI)",
                                                                      r.left_out.size()));
  out += fmt::format("{:<24} {:>7} {:>6} {:>6} {:>8} {:>7} {:>10} {:>8} {:>7}\n", "system", "kbit/s", "STOI", "ESTOI",
                     "SI-SDR", "SNR", "log-mel L1", "MR-STFT", "RTF");
  for (const EvalSystem& s : r.systems) {
    const EvalScores& t = s.total;
    out += fmt::format("{:<24} {:>7.2f} {:>6.3f} {:>6.3f} {:>8.2f} {:>7.2f} {:>10.3f} {:>8.3f} {:>7.4f}\n", s.name,
                       t.kbps, t.stoi, t.estoi, t.si_sdr_db, t.snr_db, t.log_mel_l1, t.stft_distance, t.rtf);
  }
  out += "(kbit/s: bytes stored; STOI, ESTOI, SI-SDR, SNR: higher is better; log-mel L1, MR-STFT: lower; RTF: coding "
         "seconds per second of audio)\n";
  return out;
}

std::string eval_json(const EvalResult& r) {
  nlohmann::json j;
  j["sample_rate"] = r.sample_rate;
  j["clips"] = r.clips;
  j["left_out"] = r.left_out;
  j["systems"] = nlohmann::json::array();
  for (const EvalSystem& s : r.systems) {
    nlohmann::json per = nlohmann::json::array();
    for (const EvalScores& c : s.clips) per.push_back(scores_json(c));
    j["systems"].push_back({{"name", s.name}, {"total", scores_json(s.total)}, {"clips", per}});
  }
  return j.dump(1) + "\n";
}

}  // namespace vqddp
