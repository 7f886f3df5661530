// Whole-file reads and atomic whole-file writes, with errors that name the
// file. Readers load a file completely before parsing it, so a parse error
// never leaves a half-built result; writers replace a file only once the
// new contents are safely on disk.
#pragma once

#include <string>

namespace vqddp {

// The file's bytes. stdio rather than istreambuf_iterator, which throws
// std::ios_base::failure instead of reporting an error when the path is,
// say, a directory.
std::string read_file(const std::string& path);

// Writes `bytes` to a temporary file next to `path`, fsyncs it and renames
// it over `path`: a crash leaves either the old file or the new one.
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace vqddp
