#include "data/audio_index.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
#include <thread>

#include "data/audio.h"
#include "engine/core/error.h"
#include "engine/core/file_io.h"
#include "engine/core/json_strict.h"
#include "engine/core/output_file.h"

namespace vqddp {

namespace {

namespace fs = std::filesystem;

std::string lower_extension(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext;
}

// The audio files of a source directory, sorted. An entry named like an
// audio file that is not one (a dangling symbolic link, a directory) is an
// error rather than a clip silently missing from the data.
std::vector<AudioEntry> directory_entries(const std::string& dir) {
  std::vector<AudioEntry> entries;
  const std::vector<std::string>& known = audio_extensions();
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  VQDDP_CHECK(!ec, "data source '{}': cannot list the directory: {}", dir, ec.message());
  for (const auto& e : it) {
    if (std::find(known.begin(), known.end(), lower_extension(e.path())) == known.end()) continue;
    std::error_code ec;
    VQDDP_CHECK(e.is_regular_file(ec), "data source '{}': {} is {}", dir, e.path().filename().string(),
                e.is_symlink() && !fs::exists(e.path(), ec) ? "a symbolic link to a missing file"
                                                            : "not a regular file");
    entries.push_back({e.path().string()});
  }
  std::sort(entries.begin(), entries.end(), [](const AudioEntry& a, const AudioEntry& b) { return a.path < b.path; });
  return entries;
}

std::string resolve(const std::string& list, const std::string& entry) {
  const fs::path p(entry);
  return p.is_absolute() ? entry : (fs::path(list).parent_path() / p).lexically_normal().string();
}

// A list file's or a JSONL manifest's lines.
std::vector<AudioEntry> listed_entries(const std::string& path, bool jsonl) {
  constexpr int64_t kMaxListBytes = int64_t{1} << 32;
  std::istringstream in(read_file(path, kMaxListBytes, "a data list"));
  std::vector<AudioEntry> entries;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const size_t begin = line.find_first_not_of(" \t");
    if (begin == std::string::npos || line[begin] == '#') continue;
    const std::string where = fmt::format("{}:{}", path, n);
    if (!jsonl) {
      entries.push_back({resolve(path, line.substr(begin, line.find_last_not_of(" \t") + 1 - begin))});
      continue;
    }
    const nlohmann::json j = parse_json_strict(line, where);
    VQDDP_CHECK(j.is_object(), "{}: a manifest line must be a JSON object", where);
    AudioEntry e;
    for (const auto& [key, value] : j.items()) {
      if (key == "path") {
        VQDDP_CHECK(value.is_string() && !value.get<std::string>().empty(), "{}: 'path' must be a non-empty string",
                    where);
        e.path = resolve(path, value.get<std::string>());
      } else if (key == "offset" || key == "duration" || key == "weight") {
        VQDDP_CHECK(value.is_number() && std::isfinite(value.get<double>()), "{}: '{}' must be a number", where, key);
        const double v = value.get<double>();
        if (key == "offset") {
          VQDDP_CHECK(v >= 0, "{}: 'offset' must be >= 0 seconds, got {}", where, v);
          e.offset = v;
        } else if (key == "duration") {
          VQDDP_CHECK(v > 0, "{}: 'duration' must be > 0 seconds, got {}", where, v);
          e.duration = v;
        } else {
          VQDDP_CHECK(v > 0 && v <= 1e6, "{}: 'weight' must be in (0, 1e6], got {}", where, v);
          e.weight = v;
        }
      } else {
        VQDDP_THROW("{}: unknown key '{}' (a manifest line has path, offset, duration, weight)", where, key);
      }
    }
    VQDDP_CHECK(!e.path.empty(), "{}: 'path' is required", where);
    entries.push_back(std::move(e));
  }
  VQDDP_CHECK(!entries.empty(), "data source '{}' lists no audio files", path);
  return entries;
}

// The cache's entries by path; empty when it is missing or unusable. A
// JSONL file (a version line, then one object per file) read a line at a
// time, so indexing a large corpus never holds the whole cache as a JSON tree.
std::map<std::string, AudioClip> read_cache(const std::string& cache) {
  std::map<std::string, AudioClip> by_path;
  std::error_code ec;
  if (cache.empty() || !fs::exists(cache, ec)) return by_path;
  try {
    std::istringstream in(read_file(cache, int64_t{1} << 32, "an index cache"));
    std::string line;
    if (!std::getline(in, line) || parse_json_strict(line, cache).at("vqddp_audio_index").get<int>() != 1) return by_path;
    while (std::getline(in, line)) {
      const nlohmann::json f = parse_json_strict(line, cache);
      AudioClip c;
      c.path = f.at("path").get<std::string>();
      c.bytes = f.at("bytes").get<int64_t>();
      c.mtime_ns = f.at("mtime_ns").get<int64_t>();
      c.file_rate = f.at("rate").get<int>();
      c.channels = f.at("channels").get<int>();
      c.frames = f.at("frames").get<int64_t>();
      c.ends = f.at("ends").get<uint32_t>();
      if (c.file_rate > 0 && c.channels > 0 && c.frames > 0 && c.bytes > 0) by_path[c.path] = c;
    }
  } catch (const std::exception&) {
    by_path.clear();  // a cache, never an input: rebuilt
  }
  return by_path;
}

void write_cache(const std::string& cache, const std::vector<AudioClip>& clips) {
  std::string text = nlohmann::json{{"vqddp_audio_index", 1}}.dump() + "\n";
  std::map<std::string, bool> seen;
  for (const AudioClip& c : clips) {
    if (seen[c.path]) continue;
    seen[c.path] = true;
    text += nlohmann::json{{"path", c.path},         {"bytes", c.bytes},       {"mtime_ns", c.mtime_ns},
                           {"rate", c.file_rate},   {"channels", c.channels}, {"frames", c.frames},
                           {"ends", c.ends}}.dump() + "\n";
  }
  std::error_code ec;
  const fs::path dir = fs::path(cache).parent_path();
  fs::create_directories(dir, ec);
  // The cache stays bounded: other sources' index files not rewritten for
  // kStaleDays go (a source still in use costs one header pass to index again).
  constexpr int kStaleDays = 30;
  const auto now = fs::file_time_type::clock::now();
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code time_ec;
    const auto written = fs::last_write_time(it->path(), time_ec);
    if (name.rfind("index-", 0) == 0 && it->path() != fs::path(cache) && !time_ec &&
        now - written > std::chrono::hours(24 * kStaleDays))
      fs::remove(it->path(), time_ec);
  }
  // A cache that cannot be written costs the next start a header pass, no more.
  try {
    write_file_atomic(cache, text);
  } catch (const Error&) {
  }
}

}  // namespace

std::vector<AudioEntry> list_audio_source(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return directory_entries(path);
  const std::string ext = lower_extension(path);
  VQDDP_CHECK(ext == ".jsonl" || ext == ".txt" || ext == ".list" || ext == ".lst", "data source '{}' is neither a "
              "directory of audio files nor a list (.txt, .list, .lst: one path per line) nor a JSONL manifest "
              "(.jsonl)", path);
  return listed_entries(path, ext == ".jsonl");
}

std::string audio_index_cache(const std::string& index_dir, const std::string& source_path) {
  if (index_dir == "off") return "";
  std::string dir = index_dir;
  if (dir.empty()) {
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    if (xdg && *xdg) dir = std::string(xdg) + "/vqddp";
    else if (home && *home) dir = std::string(home) + "/.cache/vqddp";
    else return "";
  }
  std::error_code ec;
  const std::string absolute = fs::absolute(source_path, ec).lexically_normal().string();
  const uint32_t key = crc32c(absolute.data(), absolute.size());
  return fmt::format("{}/index-{:08x}-{}.jsonl", dir, key, fs::path(absolute).filename().string());
}

std::vector<AudioClip> index_audio(const std::vector<AudioEntry>& entries, const std::string& cache,
                                   IndexCounts* counts) {
  const std::map<std::string, AudioClip> cached = read_cache(cache);
  std::vector<AudioClip> clips(entries.size());
  std::vector<std::string> errors(entries.size());
  std::atomic<int64_t> reused{0};
  // Each entry: one stat, and a header read where the cache has no valid
  // entry; several at a time (opening files is the cost).
  const size_t workers = std::max<size_t>(1, std::min<size_t>(entries.size(), 2 * std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  std::atomic<size_t> next{0};
  for (size_t w = 0; w < workers; ++w)
    pool.emplace_back([&] {
      for (size_t i = next++; i < entries.size(); i = next++) {
        try {
          const AudioEntry& e = entries[i];
          const auto [bytes, mtime] = file_size_and_time(e.path);
          auto hit = cached.find(e.path);
          if (hit != cached.end() && hit->second.bytes == bytes && hit->second.mtime_ns == mtime) {
            clips[i] = hit->second;
            ++reused;
          } else {
            clips[i] = audio_clip(e.path);
          }
          clips[i].offset = e.offset;
          clips[i].duration = e.duration;
          clips[i].weight = e.weight;
        } catch (const std::exception& ex) {
          errors[i] = ex.what();
        }
      }
    });
  for (std::thread& t : pool) t.join();
  for (const std::string& e : errors) VQDDP_CHECK(e.empty(), "{}", e);  // the first bad entry in order
  if (!cache.empty() && reused != static_cast<int64_t>(entries.size())) write_cache(cache, clips);
  if (counts) *counts = {static_cast<int64_t>(entries.size()), reused};
  return clips;
}

}  // namespace vqddp
