// Codes files: what `vqddp encode` writes and `vqddp decode` and `vqddp
// inspect` read. A safetensors file (engine/core/safetensors.h), so any
// safetensors reader opens it:
//
//   tensor "codes"  U8 [bytes]: the codes bit-packed, row after row (token t
//                   of frame n is row n * tokens + t), in each row layer
//                   after layer, code l in bits[l] = ceil(log2 K_l) bits
//                   (0 for a codebook of 1), least significant bit first,
//                   the last byte padded with zero bits: what the codes
//                   themselves need, and no more.
//   metadata        format "vqddp-codes/2", sample_rate, samples (of the
//                   input, after resampling), frame, tokens, layers,
//                   codebook_sizes (JSON array of the L sizes), bits (JSON
//                   array), codec_fingerprint (CRC32C of the codec's
//                   weights: decoding with other weights is refused),
//                   checkpoint_step and source (the input's file name).
//
// Every byte is under a checksum, the metadata included: a codes file
// without the metadata checksum, or whose packed size, padding or codes do
// not fit its metadata, is refused naming the file and what is wrong.
// Format 1 (vqddp before 2026-11: int64 codes, 8 bytes a code, metadata not
// checksummed) is still read, and its metadata checked against the codes'
// shape as before; `vqddp encode` again writes format 2.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vqddp {

struct CodesFile {
  int format = 2;  // 1 or 2 (above); write_codes_file writes 2
  int64_t sample_rate = 0, samples = 0, frame = 0, tokens = 0;
  // The L layers' codebook sizes. Format 1 did not store them: empty there.
  std::vector<int64_t> codebook_sizes;
  std::string codec_fingerprint;
  int64_t checkpoint_step = 0;
  std::string source;
  int64_t layers = 0;           // L
  std::vector<int64_t> codes;   // (rows, L) row-major
  bool metadata_checked = false;  // the metadata was under a verified checksum (format 2)

  int64_t rows() const { return layers > 0 ? static_cast<int64_t>(codes.size()) / layers : 0; }
  int64_t frames() const { return (samples + frame - 1) / frame; }
  double seconds() const { return static_cast<double>(samples) / static_cast<double>(sample_rate); }
};

// The most codes (rows x layers) one codes file may hold: 2^30, 8 GiB once
// read, over 300 hours of the main job's 4 x 200 codes a second. A crafted
// header cannot make a reader allocate more.
inline constexpr int64_t kMaxCodes = int64_t{1} << 30;

// Bits a code of a codebook of `size` takes when packed: ceil(log2 size).
int code_bits(int64_t size);

// Writes `c` as format 2 (engine/core/output_file.h). Checks that every code is
// inside its codebook and that rows match frames * tokens.
void write_codes_file(const std::string& path, const CodesFile& c);

// Reads and checks a format 1 or 2 file (above).
CodesFile read_codes_file(const std::string& path);

// What an entropy coder would reach on these codes: the sum over layers of
// the empirical entropy of the layer's codes (bits per code) times the rows,
// in bits per second of audio. `layers` of them (0: all).
double codes_entropy_bitrate(const CodesFile& c, int64_t layers = 0);

// The bits per second the packed codes take (the payload, no header).
double codes_packed_bitrate(const CodesFile& c);

}  // namespace vqddp
