#include "data/index_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cctype>
#include <chrono>
#include <filesystem>
#include <set>
#include <sstream>

#include "engine/core/error.h"
#include "engine/core/file_io.h"
#include "engine/core/json_strict.h"
#include "engine/core/output_file.h"
#include "engine/core/shown.h"

namespace vqddp {

namespace {

namespace fs = std::filesystem;

// Version 2 added each entry's checksum; a version 1 cache is rebuilt.
constexpr int kVersion = 2;
constexpr std::string_view kVersionKey = "vqddp_audio_index";
constexpr int kStaleDays = 30;
// The part of the source's file name in the cache's name: a long one would
// make the name longer than a file system takes.
constexpr size_t kNameChars = 64;

// CRC32C of every field of an entry, so an edit to any makes it a miss.
uint32_t entry_crc(const AudioClip& c) {
  const int64_t facts[6] = {c.bytes, c.mtime_ns, c.file_rate, c.channels, c.frames, c.ends};
  return crc32c(facts, sizeof facts, crc32c(c.path.data(), c.path.size()));
}

std::string version_line() { return nlohmann::json{{kVersionKey, kVersion}}.dump() + "\n"; }

// Whether `name` is exactly what index_cache_file makes: index-, 8 lower
// hex digits, -, a name, .jsonl.
bool cache_name(const std::string& name) {
  constexpr std::string_view kPrefix = "index-", kSuffix = ".jsonl";
  if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix) || name.size() < kPrefix.size() + 10 + kSuffix.size())
    return false;
  for (size_t i = kPrefix.size(); i < kPrefix.size() + 8; ++i)
    if (!std::isxdigit(static_cast<unsigned char>(name[i])) || std::isupper(static_cast<unsigned char>(name[i])))
      return false;
  return name[kPrefix.size() + 8] == '-';
}

// Whether the regular file `path` (opened without following a link) starts
// with a cache's version line, of any version.
bool starts_as_cache(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  const std::string head = fmt::format("{{\"{}\":", kVersionKey);
  std::string got(head.size(), '\0');
  struct stat st {};
  const bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                  ::pread(fd, got.data(), got.size(), 0) == static_cast<ssize_t>(got.size()) && got == head;
  ::close(fd);
  return ok;
}

// Other sources' caches in `dir` not rewritten for kStaleDays go (a source
// still in use costs one header pass to index again); nothing else does.
void prune(const fs::path& dir, const fs::path& keep) {
  const auto now = fs::file_time_type::clock::now();
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code entry_ec;
    const fs::path& p = it->path();
    const auto written = fs::last_write_time(p, entry_ec);
    if (p == keep || !cache_name(p.filename().string()) || !it->is_regular_file(entry_ec) || it->is_symlink(entry_ec) ||
        entry_ec || now - written <= std::chrono::hours(24 * kStaleDays) || !starts_as_cache(p))
      continue;
    fs::remove(p, entry_ec);
  }
}

}  // namespace

std::string index_cache_file(const std::string& dir, const std::string& absolute) {
  const uint32_t key = crc32c(absolute.data(), absolute.size());
  // Without a trailing slash, so that the directory's own link is seen (a
  // path ending in "/" is resolved through it).
  fs::path d = fs::path(dir).lexically_normal();
  if (!d.has_filename() && d.has_relative_path()) d = d.parent_path();
  return (d / fmt::format("index-{:08x}-{}.jsonl", key, fs::path(absolute).filename().string().substr(0, kNameChars)))
      .string();
}

std::map<std::string, AudioClip> read_index_cache(const std::string& cache) {
  std::map<std::string, AudioClip> by_path;
  std::error_code ec;
  if (cache.empty() || !fs::exists(cache, ec)) return by_path;
  try {
    std::istringstream in(read_file(cache, int64_t{1} << 32, "an index cache"));
    std::string line;
    if (!std::getline(in, line) || line + "\n" != version_line()) return by_path;
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
      if (f.at("crc").get<uint32_t>() == entry_crc(c) && c.file_rate > 0 && c.channels > 0 && c.frames > 0 &&
          c.bytes > 0)
        by_path[c.path] = c;
    }
  } catch (const std::exception&) {
    by_path.clear();  // a cache, never an input: rebuilt
  }
  return by_path;
}

std::string write_index_cache(const std::string& cache, const std::vector<AudioClip>& clips) {
  std::string text = version_line();
  std::set<std::string> seen;
  for (const AudioClip& c : clips) {
    if (!seen.insert(c.path).second) continue;
    text += nlohmann::json{{"path", c.path},     {"bytes", c.bytes},         {"mtime_ns", c.mtime_ns},
                           {"rate", c.file_rate}, {"channels", c.channels}, {"frames", c.frames},
                           {"ends", c.ends},      {"crc", entry_crc(c)}}.dump() + "\n";
  }
  std::error_code ec;
  const fs::path dir = fs::path(cache).parent_path();
  fs::create_directories(dir, ec);
  const bool linked = fs::is_symlink(dir, ec);
  if (!linked) prune(dir, cache);
  try {
    write_file_atomic(cache, text, /*remove_stale=*/!linked);
  } catch (const Error&) {
  }
  return linked ? fmt::format("index cache {} not pruned: it is a symbolic link, and vqddp deletes nothing through one",
                              shown(dir.string()))
                : "";
}

}  // namespace vqddp
