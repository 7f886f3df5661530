// safetensors I/O: the checkpoint and replay format.
//
// Layout: 8-byte little-endian header length H, H bytes of JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
//  "__metadata__": {"key": "string value"}}, then the raw little-endian data;
// offsets are relative to the end of the header.
//
// Reading validates the whole file before building any tensor, so a bad file
// never yields a half-loaded result: truncation, a bad header, an unknown or
// unsupported dtype, a shape that does not match its byte range, offsets out
// of range or overlapping each give an Error naming the file and the problem.
// Writing goes to a temporary file in the same directory, is flushed to disk
// and renamed over the target: a crash leaves either the old file or the new.
//
// Checksums: every file vqddp writes carries the CRC32C of each tensor's
// bytes in ONE metadata entry, "vqddp.crc32c", whose value (metadata values
// are strings) is a JSON object {"tensor name": "8 hex digits"}, so any
// safetensors reader still reads the file. Reading verifies them, naming
// the file and the damaged tensor. Files without the entry (other tools',
// vqddp's own from before) load unverified; SafetensorsFile::checksummed
// says which it was, for formats that require checksums. The metadata is
// under a checksum too: "vqddp.metadata_crc32c", the CRC32C of the other
// entries' canonical JSON (sorted keys), so an edited value is refused;
// SafetensorsFile::metadata_checksummed says whether the file had it.
#pragma once

#include <map>
#include <string>

#include "engine/nn.h"

namespace vqddp {

// Raw byte tensors (dtype U8), for data the engine holds no tensor type of
// (bit-packed codes): name -> bytes, in order.
using NamedBytes = std::vector<std::pair<std::string, std::string>>;

struct SafetensorsFile {
  std::string path;      // as given to safetensors_load, for error messages
  NamedTensors tensors;  // in file order of data offsets (U8 ones are in `bytes`)
  NamedBytes bytes;      // the U8 tensors, flattened, in file order
  std::map<std::string, std::string> metadata;  // without the two checksum entries
  bool checksummed = false;  // every tensor's checksum was present and verified
  bool metadata_checksummed = false;  // the metadata's checksum was present and verified

  // The tensor called `name`; throws naming the file and its tensors if absent.
  const Tensor& at(const std::string& name) const;
  bool contains(const std::string& name) const;
};

// Supported dtypes: F32, F64 and I64 (the engine's), and U8 as raw bytes.
// Others known to the format (F16, BF16, I32, ...) are refused with a
// message saying so.
// Loading gives host tensors; saving takes tensors on any device (device
// ones are copied to the host, all of them before anything is written: the
// checksums go in the header, which precedes the data). The metadata key
// "vqddp.crc32c" is reserved for the checksums.
SafetensorsFile safetensors_load(const std::string& path);
void safetensors_save(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {}, const NamedBytes& bytes = {});

}  // namespace vqddp
