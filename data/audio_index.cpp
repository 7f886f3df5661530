#include "data/audio_index.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <unordered_map>
#include <sstream>
#include <thread>

#include "data/audio.h"
#include "data/data_file.h"
#include "data/index_cache.h"
#include "engine/core/error.h"
#include "engine/core/file_io.h"
#include "engine/core/json_strict.h"
#include "engine/core/shown.h"

namespace vqddp {

namespace {

namespace fs = std::filesystem;

std::string lower_extension(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext;
}

// The audio files of a source directory, sorted. An entry named like an
// audio file that is not one (a dangling symbolic link, a link loop, a
// directory, a FIFO) is an error rather than a clip silently missing from
// the data.
std::vector<AudioEntry> directory_entries(const std::string& dir) {
  std::vector<AudioEntry> entries;
  const std::vector<std::string>& known = audio_extensions();
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  VQDDP_CHECK(!ec, "data source '{}': cannot list the directory: {}", shown(dir), ec.message());
  for (const auto& e : it) {
    if (std::find(known.begin(), known.end(), lower_extension(e.path())) == known.end()) continue;
    std::error_code ec;
    if (!e.is_regular_file(ec)) {  // one stat more, for the few that are not
      const std::string problem = file_problem(e.path().string());
      VQDDP_CHECK(problem.empty(), "data source '{}': {} {}", shown(dir), shown(e.path().filename().string()), problem);
    }
    entries.push_back({e.path().string()});
  }
  std::sort(entries.begin(), entries.end(), [](const AudioEntry& a, const AudioEntry& b) { return a.path < b.path; });
  return entries;
}

// A path as open(2) takes it: PATH_MAX bytes with its NUL. A longer one
// could never be read; it is refused by line before any message echoes it.
constexpr size_t kMaxPathBytes = 4095;

// A list's entry as a path to open, `where` naming the list's line. A NUL
// would end the name the system sees ("a.wav\u0000.txt" reads a.wav).
std::string entry_path(const std::string& list, const std::string& entry, const std::string& where) {
  const size_t nul = entry.find('\0');
  VQDDP_CHECK(nul == std::string::npos, "{}: the path holds a NUL character after \"{}\": no file name can", where,
              shown(entry.substr(0, nul)));
  const fs::path p(entry);
  const std::string path = (p.is_absolute() ? p : fs::path(list).parent_path() / p).lexically_normal().string();
  VQDDP_CHECK(path.size() <= kMaxPathBytes, "{}: a path of {} bytes, more than the {} a file's path may have: {}",
              where, path.size(), kMaxPathBytes, shown(path));
  return path;
}

// A list read whole, without the UTF-8 byte order mark some editors put
// first (it would otherwise start the first path, or precede a manifest's
// first object): for every kind of list.
std::string list_text(const std::string& path) {
  constexpr int64_t kMaxListBytes = int64_t{1} << 32;
  std::string text = read_file(path, kMaxListBytes, "a data list");
  constexpr std::string_view kBom = "\xEF\xBB\xBF";
  if (text.starts_with(kBom)) text.erase(0, kBom.size());
  return text;
}

// A manifest's number, bounded before it is used: finite and within
// `range` (from data/audio_windows.h's limits), so no seconds x rate or
// weight x windows can overflow.
struct NumberRange {
  double max;
  bool positive;      // (0, max], else [0, max]
  const char* shown;  // for the message
};
constexpr NumberRange kOffsetRange{kMaxClipSeconds, false, "[0, 1e7] seconds"};
constexpr NumberRange kDurationRange{kMaxClipSeconds, true, "(0, 1e7] seconds"};
constexpr NumberRange kWeightRange{kMaxClipWeight, true, "(0, 1e6]"};

double manifest_number(const nlohmann::json& value, const std::string& key, const NumberRange& range,
                       const std::string& where) {
  const bool number = value.is_number();
  const double v = number ? value.get<double>() : 0;
  VQDDP_CHECK(number && std::isfinite(v) && (range.positive ? v > 0 : v >= 0) && v <= range.max, "{}: '{}' must be "
              "in {}, got {}", where, key, range.shown, shown(value.dump()));
  return v;
}

// One manifest line's entry (its path as written).
AudioEntry manifest_entry(const std::string& line, const std::string& where) {
  const nlohmann::json j = parse_json_strict(line, where);
  VQDDP_CHECK(j.is_object(), "{}: a manifest line must be a JSON object", where);
  AudioEntry e;
  for (const auto& [key, value] : j.items()) {
    if (key == "path") {
      VQDDP_CHECK(value.is_string() && !value.get<std::string>().empty(), "{}: 'path' must be a non-empty string",
                  where);
      e.path = value.get<std::string>();
    } else if (key == "offset") {
      e.offset = manifest_number(value, key, kOffsetRange, where);
    } else if (key == "duration") {
      e.duration = manifest_number(value, key, kDurationRange, where);
    } else if (key == "weight") {
      e.weight = manifest_number(value, key, kWeightRange, where);
    } else {
      VQDDP_THROW("{}: unknown key '{}' (a manifest line has path, offset, duration, weight)", where, shown(key));
    }
  }
  VQDDP_CHECK(!e.path.empty(), "{}: 'path' is required", where);
  return e;
}

// The same clip listed twice would count twice, and one copy could be held
// out for validation while the other trains: refused, naming both lines.
class DuplicateCheck {
 public:
  void add(const AudioEntry& e, int64_t line, const std::string& list) {
    std::string key = e.path;
    key.append(reinterpret_cast<const char*>(&e.offset), sizeof e.offset);
    key.append(reinterpret_cast<const char*>(&e.duration), sizeof e.duration);
    const auto [it, added] = lines_.emplace(std::move(key), line);
    VQDDP_CHECK(added, "{}:{}: {}{} is listed already on line {}: a clip listed twice trains twice as often, and may "
                "be held out for validation while its copy trains", shown(list), line, shown(e.path),
                segment_text(e.offset, e.duration), it->second);
  }

 private:
  std::unordered_map<std::string, int64_t> lines_;
};

// A list file's or a JSONL manifest's lines.
std::vector<AudioEntry> listed_entries(const std::string& path, bool jsonl) {
  std::istringstream in(list_text(path));
  std::vector<AudioEntry> entries;
  DuplicateCheck duplicates;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const size_t begin = line.find_first_not_of(" \t");
    if (begin == std::string::npos || line[begin] == '#') continue;
    const std::string where = fmt::format("{}:{}", shown(path), n);
    AudioEntry e = jsonl ? manifest_entry(line, where)
                         : AudioEntry{line.substr(begin, line.find_last_not_of(" \t") + 1 - begin)};
    e.path = entry_path(path, e.path, where);
    duplicates.add(e, n, path);
    entries.push_back(std::move(e));
  }
  VQDDP_CHECK(!entries.empty(), "data source '{}' lists no audio files", shown(path));
  return entries;
}

}  // namespace

std::vector<AudioEntry> list_audio_source(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return directory_entries(path);
  const std::string ext = lower_extension(path);
  VQDDP_CHECK(ext == ".jsonl" || ext == ".txt" || ext == ".list" || ext == ".lst", "data source '{}' is neither a "
              "directory of audio files nor a list (.txt, .list, .lst: one path per line) nor a JSONL manifest "
              "(.jsonl)", shown(path));
  return listed_entries(path, ext == ".jsonl");
}

std::string segment_text(double offset, double duration) {
  if (offset == 0 && duration < 0) return "";
  return duration < 0 ? fmt::format(" (from {} s)", offset) : fmt::format(" (from {} s for {} s)", offset, duration);
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
  return index_cache_file(dir, fs::absolute(source_path, ec).lexically_normal().string());
}

namespace {

// The clip of `e` from its cache entry where that still describes the file
// (the same size and time, and the same first and last 4 KiB, which hold
// the header the entry's rate, channels and frames were read from: an open
// and two 4 KiB reads, next to a header pass's decoder set-up), else read
// from the file. Sets `reused` when the entry served.
AudioClip entry_clip(const AudioEntry& e, const std::map<std::string, AudioClip>& cached, bool& reused) {
  const DataFile file(e.path);
  const auto hit = cached.find(e.path);
  reused = hit != cached.end() && hit->second.bytes == file.stamp().bytes &&
           hit->second.mtime_ns == file.stamp().mtime_ns && hit->second.ends == ends_crc(file, e.path);
  AudioClip c = reused ? hit->second : audio_clip(e.path);
  c.device = file.stamp().device;
  c.inode = file.stamp().inode;
  c.offset = e.offset;
  c.duration = e.duration;
  c.weight = e.weight;
  return c;
}

}  // namespace

std::vector<AudioClip> index_audio(const std::vector<AudioEntry>& entries, const std::string& cache,
                                   IndexCounts* counts, bool skip_bad) {
  const std::map<std::string, AudioClip> cached = read_index_cache(cache);
  std::vector<AudioClip> clips(entries.size());
  std::vector<std::string> errors(entries.size());
  std::atomic<int64_t> reused{0};
  // Several entries at a time (opening files is the cost).
  const size_t workers = std::max<size_t>(1, std::min<size_t>(entries.size(), 2 * std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  std::atomic<size_t> next{0};
  for (size_t w = 0; w < workers; ++w)
    pool.emplace_back([&] {
      for (size_t i = next++; i < entries.size(); i = next++) {
        try {
          bool hit = false;
          clips[i] = entry_clip(entries[i], cached, hit);
          reused += hit;
        } catch (const Error& ex) {
          errors[i] = with_path_shown(ex, entries[i].path).what();
        } catch (const std::exception& ex) {
          errors[i] = ex.what();
        }
      }
    });
  for (std::thread& t : pool) t.join();
  std::vector<std::string> skipped;
  if (!skip_bad) {
    for (const std::string& e : errors) VQDDP_CHECK(e.empty(), "{}", e);  // the first bad entry in order
  } else {
    std::vector<AudioClip> kept;
    for (size_t i = 0; i < entries.size(); ++i)
      if (errors[i].empty()) kept.push_back(std::move(clips[i]));
      else skipped.push_back(std::move(errors[i]));
    clips = std::move(kept);
  }
  std::string note;
  if (!cache.empty() && reused != static_cast<int64_t>(clips.size())) note = write_index_cache(cache, clips);
  if (counts) *counts = {static_cast<int64_t>(entries.size()), reused, note, std::move(skipped)};
  return clips;
}

}  // namespace vqddp
