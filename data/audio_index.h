// A data set's audio clips: what each source lists, and the header facts of
// every file, read in one pass over the headers and cached.
//
// Sources (data.sources[i].path):
//   a directory  its audio files (data/audio.h's extensions, any case),
//                sorted by name, not recursive;
//   FILE.txt, FILE.list, FILE.lst
//                one path per line (blank lines and lines starting with #
//                skipped), relative paths from the list's directory;
//   FILE.jsonl   one JSON object per line: "path" (relative as above), and
//                optionally "offset" and "duration" in seconds (a segment of
//                the file; the rest of the file from the offset without a
//                duration) and "weight" (> 0, 1 by default: the entry's
//                windows count that many times over in its source's share,
//                see AudioWindows).
// A list may start with a UTF-8 byte order mark. Refused naming the list
// and the line: a line that is not valid JSON (with its column), a number
// out of range (offset in [0, 1e7] s, duration in (0, 1e7] s, weight in
// (0, 1e6]), a path holding a NUL or longer than 4095 bytes, and a path (or
// one segment of it) listed twice, naming both lines. One file under two
// names is refused too (data/dataset.h), naming both.
//
// The index: for each file its size, modification time, rate, channels,
// frames and a CRC32C of its first and last 4 KiB (data/audio_windows.h
// AudioClip). It is cached in data.index_dir (by default
// $XDG_CACHE_HOME/vqddp or ~/.cache/vqddp; "off": none), one file per source
// path (data/index_cache.h). At each start every file is opened: an entry
// whose size, modification time and first and last 4 KiB still match is
// reused (those bytes hold the header its rate, channels and frames were
// read from, so a file rewritten in place with its size and time restored
// is read again; an open and two 4 KiB reads cost far less than a header
// pass, which sets up a decoder), any other file's header is read again,
// and the cache is rewritten when something changed. Ranks and runs that
// read the same sources share it; nodes that mount the corpus at other
// paths index it each on their own and still agree (the data fingerprint
// leaves paths out).
// Internal header: not installed with the library (the audio readers' header cache).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/audio_windows.h"
#include "data/data_config.h"

namespace vqddp {

// One entry of a source, in order: a file, or a segment of one.
struct AudioEntry {
  std::string path;
  double offset = 0;     // seconds
  double duration = -1;  // seconds; < 0: to the end of the file
  double weight = 1;
};

// What a source's path lists (the forms above). Errors name the source and,
// for a list or manifest, the line.
std::vector<AudioEntry> list_audio_source(const std::string& path);

// " (from 1.5 s for 2 s)": an entry's segment for a message ("" for a whole file).
std::string segment_text(double offset, double duration);

struct IndexCounts {
  int64_t files = 0, reused = 0;  // files indexed, and of them taken from the cache
  std::string note;               // for the run's log: why the cache was not pruned ("" when it was)
  std::vector<std::string> skipped;  // with skip_bad: each entry left out, as its error names it
};

// The clips of `entries` (their header facts from the cache where still
// valid, else read, several files at a time), in order, with each entry's
// segment and weight. `cache` is the cache file ("" for none). An entry
// whose header cannot be read (an empty or truncated file, not audio) stops
// the index naming it, or with `skip_bad` (data.bad_files "skip") is left
// out and named in counts->skipped: every rank reads the same headers, so
// every rank leaves out the same entries.
std::vector<AudioClip> index_audio(const std::vector<AudioEntry>& entries, const std::string& cache,
                                   IndexCounts* counts = nullptr, bool skip_bad = false);

// The cache file for a source path under `index_dir` ("" for the default
// directory, "off" for none: returns "").
std::string audio_index_cache(const std::string& index_dir, const std::string& source_path);

}  // namespace vqddp
