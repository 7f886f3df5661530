// The header index's cache (data/audio_index.h says what it holds and when
// it is used): one JSONL file per source, a version line then one entry per
// file. A cache is never an input: a file that cannot be read or parsed is
// ignored, and an entry whose own checksum (over every field) does not
// match, or whose values are out of range, is a miss, so an edited entry is
// read from its file again instead of trusted.
//
// Writing one prunes the directory of other sources' caches not rewritten
// for 30 days, and of nothing else: a file is deleted only when it is one
// this code wrote (its exact name form index-XXXXXXXX-NAME.jsonl, a regular
// file, not a link, starting with the version line), and nothing is
// deleted through a cache directory that is a symbolic link (the cache is
// still read and written there; the run's log says it was not pruned).
// Internal header: not installed with the library.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "data/audio_windows.h"

namespace vqddp {

// The cache file of the source at `absolute` (an absolute, normal path) in `dir`.
std::string index_cache_file(const std::string& dir, const std::string& absolute);

// The cache's valid entries by path (empty when it is missing or unusable).
std::map<std::string, AudioClip> read_index_cache(const std::string& cache);

// Writes `clips` as the cache (a cache that cannot be written costs the next
// start a header pass, no more), and prunes. Returns a note for the run's
// log, "" when there is none.
std::string write_index_cache(const std::string& cache, const std::vector<AudioClip>& clips);

}  // namespace vqddp
