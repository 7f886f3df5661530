// IDX reader: the MNIST-family image and label files, as training data.
//
// Layout: magic bytes 0x00 0x00 <type> <ndim>, then ndim big-endian uint32
// sizes, then the data (big-endian for multi-byte types). Only unsigned-byte
// arrays (type 0x08) are read, which is what MNIST and Fashion-MNIST hold;
// other types are refused by name rather than converted.
//
// Files go through zlib's gzread, which reads gzip-compressed and plain
// files alike. The reader insists the data fill the shape exactly: it reads
// one byte past it, so bytes left over are an Error and the gzip trailer's
// CRC is always checked, and a corrupt stream never yields a plausible array.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/dtype.h"

namespace vqddp {

struct IdxArray {
  Shape shape;                // e.g. (N, 28, 28) images or (N,) labels
  std::vector<uint8_t> data;  // (prod(shape),) row-major
};

// Throws Error naming `path` for a file it cannot open, bad magic, a type
// other than 0x08, a header or data shorter than the shape needs, bytes after
// the data, or a corrupt gzip stream.
IdxArray read_idx(const std::string& path);

}  // namespace vqddp
