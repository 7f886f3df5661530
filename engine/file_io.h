// Whole-file reads and atomic whole-file writes, with errors that name the
// file. Readers load a file completely before parsing it, so a parse error
// never leaves a half-built result; writers replace a file only once the
// new contents are safely on disk. CRC32C lets a format detect bytes that
// changed on disk after they were written.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace vqddp {

// Refuses, naming the file and what it is, anything but a regular file:
// a FIFO would block the reader until some writer came, /dev/zero would
// never end, a directory has no bytes. Readers that open files themselves
// (gzip) call it first.
void require_regular_file(const std::string& path);

// The bytes of the regular file `path` (require_regular_file), at most
// `max_bytes` of them: a bigger file is refused before it is read, naming
// the file, its size and the limit for `what` ("a config file"). The FIFO
// check happens on a non-blocking open, so it cannot hang either.
inline constexpr int64_t kNoSizeLimit = -1;
std::string read_file(const std::string& path, int64_t max_bytes = kNoSizeLimit, const char* what = "this file");

// Writes `bytes` to a temporary file next to `path`, fsyncs it and renames
// it over `path`: a crash leaves either the old file or the new one, and
// possibly the temporary `<path>.tmp.<pid>.<8 hex digits>` (see below).
void write_file_atomic(const std::string& path, const std::string& bytes);

// Removes the temporaries write_file_atomic left next to `path` when its
// process died mid-write (kill -9, power loss): those whose pid names no
// running process, and those of this process's own pid, which can only be
// an earlier process's that had the same pid (a restarted container hands
// out the same pids). Sharp edge: call it before this process writes `path`
// and never concurrently with such a write. A pid of another host (a
// directory shared over NFS) may look dead here: use it where one host
// writes `path`. Returns the paths removed.
std::vector<std::string> remove_stale_temporaries(const std::string& path);

// CRC32C (Castagnoli, reflected, as iSCSI and ext4 use) of `n` bytes,
// continuing from `crc` (0 to start): crc32c("123456789") == 0xe3069283.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace vqddp
