// Whole-file reads, with errors that name the file: readers load a file
// completely before parsing it, so a parse error never leaves a half-built
// result. CRC32C lets a format detect bytes that changed on disk after they
// were written. Writing is engine/core/output_file.h's.
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

// CRC32C (Castagnoli, reflected, as iSCSI and ext4 use) of `n` bytes,
// continuing from `crc` (0 to start): crc32c("123456789") == 0xe3069283.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace vqddp
