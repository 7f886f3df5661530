#include "data/dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <atomic>
#include <cctype>
#include <filesystem>
#include <map>
#include <new>
#include <tuple>

#include "data/data_file.h"
#include "engine/core/file_io.h"
#include "engine/core/shown.h"
#include "engine/core/memory_budget.h"
#include "engine/ops.h"
#include "data/idx.h"
#include "data/audio.h"
#include "data/audio_index.h"
#include "data/audio_windows.h"

namespace vqddp {

namespace {

// The reason a source's path cannot be read, with what it must be.
void require_source(const DataSourceConfig& src) {
  const std::string problem = path_problem(src.path);
  if (problem.empty()) return;
  VQDDP_THROW("data source '{}' {}: it must be a directory of audio files ({}), a list of them (.txt, .list, .lst) or "
              "a JSONL manifest (.jsonl); {}", shown(src.path), problem, fmt::join(audio_extensions(), ", "),
              src.made_by.empty() ? fmt::format("`vqddp convert AUDIO... --out {}` makes one from audio files of any "
                                                "format", shown(src.path))
                                  : fmt::format("this config's data is made first, by `{}`", src.made_by));
}

// One file under two names (a link, a hard link, the same directory as two
// sources) would be one clip twice, and one copy could be held out for
// validation while the other trains: refused, naming both. A file's
// segments are distinct clips when their offset or duration differ.
void refuse_twins(const std::vector<std::vector<AudioClip>>& clips) {
  std::map<std::tuple<uint64_t, uint64_t, double, double>, const AudioClip*> seen;
  for (const std::vector<AudioClip>& source : clips)
    for (const AudioClip& c : source) {
      const auto [it, added] = seen.emplace(std::tuple(c.device, c.inode, c.offset, c.duration), &c);
      VQDDP_CHECK(added, "{} and {} are the same file{}: one clip listed twice trains twice as often, and may be held "
                  "out for validation while its copy trains", shown(it->second->path), shown(c.path),
                  segment_text(c.offset, c.duration));
    }
}

// The log's account of the files data.bad_files "skip" left out at the
// index: how many, and the first few as their errors name them.
std::string skipped_text(const std::vector<std::string>& skipped) {
  if (skipped.empty()) return "";
  constexpr size_t kNamed = 5;
  const size_t named = std::min(skipped.size(), kNamed);
  std::string text = fmt::format("; {} unreadable file{} left out (data.bad_files \"skip\"): {}", skipped.size(),
                                 skipped.size() == 1 ? "" : "s",
                                 fmt::join(skipped.begin(), skipped.begin() + static_cast<ptrdiff_t>(named), "; "));
  if (skipped.size() > named) text += fmt::format("; and {} more", skipped.size() - named);
  return text;
}

Dataset load_wav_frames(const DataConfig& c) {
  Dataset d;
  d.example_dim = c.frame;
  // Every source's clips first (data/audio_index.h): the rate rule needs the
  // first clip.
  std::vector<std::vector<AudioClip>> clips;
  IndexCounts counts;
  for (const DataSourceConfig& src : c.sources) {
    require_source(src);
    std::vector<AudioEntry> entries = list_audio_source(src.path);
    if (c.max_files > 0 && static_cast<int64_t>(entries.size()) > c.max_files) entries.resize(c.max_files);
    VQDDP_CHECK(!entries.empty(), "data source '{}' holds no audio files ({})", shown(src.path),
                fmt::join(audio_extensions(), ", "));
    IndexCounts source_counts;
    clips.push_back(index_audio(entries, audio_index_cache(c.index_dir, src.path), &source_counts,
                                c.bad_files == "skip"));
    VQDDP_CHECK(!clips.back().empty(), "data source '{}' holds no readable audio files (the first: {})",
                shown(src.path), source_counts.skipped.empty() ? "" : source_counts.skipped[0]);
    for (std::string& why : source_counts.skipped) counts.skipped.push_back(std::move(why));
    counts.files += source_counts.files;
    counts.reused += source_counts.reused;
    if (counts.note.empty()) counts.note = source_counts.note;
  }
  refuse_twins(clips);
  // data.sample_rate, or the first clip's: then every clip must have it.
  // (Named by a copy: the clips are moved into their sources below.)
  const int rate = c.sample_rate > 0 ? static_cast<int>(c.sample_rate) : clips[0][0].file_rate;
  const std::string first_path = clips[0][0].path;
  std::vector<AudioClip> validation;
  int64_t count = 0, held = 0, resampled = 0;
  for (size_t s = 0; s < clips.size(); ++s) {
    std::vector<AudioClip> train;
    for (size_t i = 0; i < clips[s].size(); ++i) {
      AudioClip& clip = clips[s][i];
      VQDDP_CHECK(c.sample_rate > 0 || clip.file_rate == rate, "{}: sample rate {} Hz differs from the {} Hz of {} (set "
                  "data.sample_rate to resample every clip to one rate)", shown(clip.path), clip.file_rate, rate,
                  shown(first_path));
      resampled += clip.file_rate != rate;
      const bool holdout = static_cast<int64_t>(i) % c.holdout_every == c.holdout_every - 1;
      (holdout ? validation : train).push_back(std::move(clip));
      ++count;
      held += holdout;
    }
    d.sources.emplace_back(std::make_shared<AudioWindows>(std::move(train), rate, c.frame, c.max_examples));
    d.weights.push_back(c.sources[s].weight);
    VQDDP_CHECK(d.sources.back().rows() > 0, "data source '{}' yields no training frames of {} samples",
                shown(c.sources[s].path), c.frame);
  }
  d.validation = DataRows(std::make_shared<AudioWindows>(std::move(validation), rate, c.frame));
  d.examples_per_second = static_cast<double>(rate) / c.frame;
  d.sample_rate = rate;
  d.description = fmt::format("{} audio clips at {} Hz ({} resampled, {} held out), frames of {} samples, {} of {} "
                              "headers from the index cache{}{}", count, rate, resampled, held, c.frame, counts.reused,
                              counts.files, counts.note.empty() ? "" : " (" + counts.note + ")",
                              skipped_text(counts.skipped));
  return d;
}

Tensor images_of(const std::string& path, int64_t limit) {
  IdxArray a = read_idx(path);
  VQDDP_CHECK(a.shape.size() == 3, "{}: expected images [N, H, W], got {} dimensions", path, a.shape.size());
  int64_t n = a.shape[0], dim = a.shape[1] * a.shape[2];
  if (limit > 0) n = std::min(n, limit);
  Tensor t = empty({n, dim});
  float* p = t.data<float>();
  for (int64_t i = 0; i < n * dim; ++i) p[i] = a.data[i] / 255.f;
  return t;
}

Dataset load_fashion_mnist(const DataConfig& c) {
  Dataset d;
  for (const DataSourceConfig& src : c.sources) {
    d.sources.push_back(images_of(src.path, c.max_examples));
    d.weights.push_back(src.weight);
  }
  d.example_dim = d.sources[0].dim();
  for (const DataRows& s : d.sources)
    VQDDP_CHECK(s.dim() == d.example_dim, "data sources have different image sizes ({} vs {} pixels)", s.dim(),
                d.example_dim);
  VQDDP_CHECK(!c.validation_path.empty(), "data.validation_path is required for fashion_mnist");
  d.validation = images_of(c.validation_path, 0);
  VQDDP_CHECK(d.validation.dim() == d.example_dim, "{}: validation images have {} pixels, training images {}",
              c.validation_path, d.validation.dim(), d.example_dim);
  int64_t total = 0;
  for (const DataRows& s : d.sources) total += s.rows();
  d.description = fmt::format("{} training and {} validation images of {} pixels", total, d.validation.rows(),
                              d.example_dim);
  return d;
}

}  // namespace

Dataset load_dataset(const DataConfig& c) {
  const auto start = std::chrono::steady_clock::now();
  Dataset d = c.type == "wav_frames" ? load_wav_frames(c) : load_fashion_mnist(c);
  d.skip_bad_rows = c.bad_files == "skip";
  d.readers = static_cast<int>(c.readers);
  d.prefetch = static_cast<int>(c.prefetch);
  VQDDP_CHECK(d.validation.rows() > 0, "data: the validation set is empty ({}); for wav_frames, holdout_every={} "
              "needs at least that many clips per source", d.description, c.holdout_every);
  // Printed only (the ranks' data fingerprints do not read it).
  d.description += fmt::format(", {} in {:.2f} s", c.type == "wav_frames" ? "indexed" : "read",
                               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return d;
}

uint32_t data_fingerprint(const Dataset& data) {
  const uint64_t sources = data.sources.size();
  uint32_t crc = crc32c(&sources, sizeof sources);
  for (const DataRows& s : data.sources) crc = s.fingerprint(crc);
  return data.validation.fingerprint(crc);
}

std::vector<std::string> held_out_clips(const Dataset& data) {
  std::vector<std::string> paths;
  if (const auto* windows = dynamic_cast<const AudioWindows*>(data.validation.source()))
    for (const AudioClip& clip : windows->clips()) paths.push_back(clip.path);
  return paths;
}

}  // namespace vqddp
