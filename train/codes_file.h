// Codes files: what `vqddp encode` writes and `vqddp decode` and `vqddp
// inspect` read.
//
// Format 3 (`vqddp encode` writes it): the codes entropy-coded under the
// codec's code model (CodeModel below), in a compact binary file whose
// header is a few dozen bytes. Integers are unsigned LEB128 varints
// (7 bits a byte, low first, at most 10 bytes, no redundant zero byte),
// u32 are 4 bytes little-endian:
//
//   "VQDC" 0x03                 magic and version (5 bytes)
//   sample_rate, samples (of the input, after resampling), frame, tokens,
//   layers L, L codebook sizes  varints
//   codec fingerprint           u32 (CRC32C of the codec's weights: decoding
//                               with other weights is refused)
//   checkpoint_step             varint
//   code model CRC              u32 (CodeModel::crc of the L tables: codes
//                               coded under other tables are refused)
//   chunk_frames                varint (encode's --chunk, default 256)
//   source length, source       varint + bytes (the input's file name; may be empty)
//   header CRC                  u32: CRC32C of every header byte before it
//
// then ceil(frames / chunk_frames) chunks, each holding chunk_frames
// frames (the last one the rest):
//
//   length                      varint: payload bytes
//   CRC                         u32: CRC32C of the chunk number (u32),
//                               seeded with the header CRC, then the payload
//   payload                     the chunk's codes, row after row (token t of
//                               frame n is row n * tokens + t), in each row
//                               layer after layer, range-coded
//                               (train/range_coder.h) with layer l's table;
//                               a coder of its own per chunk
//
// and nothing after the last chunk. The main job's 10 s (4 layers of 256,
// 40 tokens a frame at 8 kHz) has a header of 39 bytes plus the source name
// and one chunk (6 bytes of length and CRC). Each chunk decodes alone: a damaged chunk (its CRC does not
// match) is named with the frames and seconds it covers, and the others
// still decode (CodesReader; `vqddp decode --skip-damaged` writes silence in
// its place). After a damaged chunk the next is searched for byte by byte
// (its CRC, which covers its number, says it is found), so a damaged length
// loses only its own chunk; only when the next chunk is damaged too are the
// rest lost, each named damaged. Reading is chunk by chunk: the decoder
// holds one chunk's codes at a time.
//
// Format 2 (vqddp 2026-11 up to format 3): a safetensors file, its one
// tensor "codes" (U8) the codes bit-packed in bits[l] = ceil(log2 K_l) bits
// (0 for a codebook of 1), least significant bit first, row after row, the
// last byte padded with zero bits; metadata format "vqddp-codes/2",
// sample_rate, samples, frame, tokens, layers, codebook_sizes, bits,
// codec_fingerprint, checkpoint_step, source, all under the checksum.
// Format 1 (before 2026-11: int64 codes, metadata not checksummed). Both are
// still read, and checked as before: a file without checksums, or whose
// packed size, padding or codes do not fit its metadata, is refused naming
// the file and what is wrong.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace vqddp {

// The probability model a codes file is coded under: per layer a static
// frequency table of its K codes, summing to 2^16, each code at least 1 (so
// any code can be coded). Its source is the codec's checkpoint: the EMA of
// the training batches' code counts that EMA codebooks keep already (the
// buffers quantizer.layer{l}.cluster_size, Codec::code_model), scaled to the
// total with a floor of 1 a code. A quantizer that keeps no counts (FSQ,
// LFQ, learnable codebooks) gets uniform tables: coding gains nothing there
// but works. A codebook of more than 2^16 codes is coded as ceil(log2 K)
// raw bits.
class CodeModel {
 public:
  CodeModel() = default;
  // counts[l]: layer l's code counts (any scale; empty: uniform).
  static CodeModel from_counts(const std::vector<int64_t>& sizes, const std::vector<std::vector<double>>& counts);
  static CodeModel uniform(const std::vector<int64_t>& sizes);

  int64_t layers() const { return static_cast<int64_t>(sizes_.size()); }
  int64_t size(int64_t l) const { return sizes_[static_cast<size_t>(l)]; }
  // Layer l's frequencies (empty: raw bits, K > 2^16).
  const std::vector<uint32_t>& frequencies(int64_t l) const { return freqs_[static_cast<size_t>(l)]; }
  bool counted(int64_t l) const { return counted_[static_cast<size_t>(l)]; }
  // -log2 p(code) under layer l's table: the ideal cost of the code in bits.
  double cost(int64_t l, int64_t code) const;
  // CRC32C of the first `layers` tables (sizes and frequencies).
  uint32_t crc(int64_t layers) const;

 private:
  std::vector<int64_t> sizes_;
  std::vector<std::vector<uint32_t>> freqs_;
  std::vector<bool> counted_;
};

struct CodesFile {
  int format = 3;  // 1, 2 or 3 (above); write_codes_file writes 3
  int64_t sample_rate = 0, samples = 0, frame = 0, tokens = 0;
  // The L layers' codebook sizes. Format 1 did not store them: empty there.
  std::vector<int64_t> codebook_sizes;
  std::string codec_fingerprint;  // 8 hex digits
  int64_t checkpoint_step = 0;
  std::string source;
  int64_t layers = 0;           // L
  std::vector<int64_t> codes;   // (rows, L) row-major; empty where only the header was read
  bool metadata_checked = false;  // the metadata was under a verified checksum (formats 2 and 3)
  int64_t chunk_frames = 256;     // format 3: frames a chunk
  uint32_t code_model_crc = 0;    // format 3: the tables' CRC (CodeModel::crc)
  int64_t file_bytes = 0;         // read: the file's size

  int64_t rows() const { return layers > 0 ? static_cast<int64_t>(codes.size()) / layers : 0; }
  int64_t frames() const { return (samples + frame - 1) / frame; }
  int64_t chunks() const { return chunk_frames > 0 ? (frames() + chunk_frames - 1) / chunk_frames : 0; }
  double seconds() const { return static_cast<double>(samples) / static_cast<double>(sample_rate); }
};

// The most codes (rows x layers) one codes file may hold: 2^30, 8 GiB once
// read, over 300 hours of the main job's 4 x 200 codes a second. A crafted
// header cannot make a reader allocate more.
inline constexpr int64_t kMaxCodes = int64_t{1} << 30;

// Bits a code of a codebook of `size` takes when packed: ceil(log2 size).
int code_bits(int64_t size);

// Codes (rows x sizes.size(), row-major), each in code_bits(size) bits,
// least significant first, row after row, the last byte padded with zero
// bits: ceil(rows * row bits / 8) bytes (format 2, stream packets). The
// caller has checked the codes are inside their codebooks.
std::string pack_codes(const int64_t* codes, int64_t rows, const std::vector<int64_t>& sizes);
// The bytes pack_codes gives for `rows` rows.
int64_t packed_codes_bytes(int64_t rows, const std::vector<int64_t>& sizes);
// The inverse over exactly those bytes: rows x sizes.size() codes, not
// checked against their codebooks (the caller names a bad one); false when
// a padding bit is not zero.
bool unpack_codes(const unsigned char* bytes, int64_t rows, const std::vector<int64_t>& sizes,
                  std::vector<int64_t>& codes);

// `c` as format 3 under `model` (its first c.layers tables, which must have
// c's codebook sizes), in chunks of c.chunk_frames frames: the file's bytes.
// Checks that every code is inside its codebook and that rows match
// frames * tokens.
std::string codes_file_bytes(const CodesFile& c, const CodeModel& model);
// The same, written to `path` (engine/core/output_file.h).
void write_codes_file(const std::string& path, const CodesFile& c, const CodeModel& model);
// Format 2 (above), as vqddp wrote before format 3: for tests of the reader.
void write_codes_file_format2(const std::string& path, const CodesFile& c);

// Reads and checks a codes file of format 1, 2 or 3. Format 3 needs the
// model it was coded under (refused without one, or under other tables);
// a damaged chunk is refused naming it (CodesReader reads the others).
CodesFile read_codes_file(const std::string& path, const CodeModel* model = nullptr);
// Its metadata, checked: format 3 reads the header only (codes empty);
// formats 1 and 2 are read whole (read_codes_file).
CodesFile read_codes_header(const std::string& path);
// Whether `path` begins as a format-3 codes file does ("VQDC").
bool is_codes_file_format3(const std::string& path);

// A format-3 file chunk by chunk: its header read and checked on opening,
// then each chunk's bytes and checksum, one at a time.
class CodesReader {
 public:
  explicit CodesReader(const std::string& path);
  const CodesFile& header() const { return c_; }

  struct Chunk {
    int64_t index = 0, first_frame = 0, frames = 0;
    int64_t offset = 0;   // where in the file its length starts
    bool damaged = false;
    std::string why;      // damaged: what is wrong, naming the file and the chunk
    std::string payload;
  };
  // The next chunk (false after the last, once the file is checked to end
  // there). A chunk whose CRC does not match, or whose length cannot be
  // read or runs past the file, comes back damaged; after a bad length
  // every later chunk is damaged too.
  bool next(Chunk& chunk);
  // A sound chunk's codes (frames * tokens rows x L), decoded under `model`
  // (checked against the header's code model CRC).
  std::vector<int64_t> codes(const Chunk& chunk, const CodeModel& model) const;
  // The name, frames and seconds of chunk `index`: "chunk 2 of 5 (frames
  // 256-511, 51.20-102.40 s)".
  std::string describe(int64_t index) const;

 private:
  std::string path_;
  std::ifstream in_;
  CodesFile c_;
  uint32_t header_crc_ = 0;
  // The offset of chunk `index` (a sound chunk of that number: length, CRC
  // and payload): at `first_try` if it is there, else searched for from
  // `from` + 1 on; -1 if not found.
  int64_t find_chunk(int64_t from, int64_t index, int64_t first_try);

  int64_t first_chunk_at_ = 0;
  int64_t at_ = 0;         // file offset of the next chunk
  int64_t next_index_ = 0;
  bool lost_ = false;      // a damaged chunk's successor was not found: the rest cannot be
};

// Every damaged chunk of a format-3 file, in order (its chunks read through
// once): what is wrong (naming the file and the chunk) and the chunk's
// frames and seconds (CodesReader::describe).
struct DamagedChunk {
  std::string why, described;
};
std::vector<DamagedChunk> damaged_chunks(const std::string& path);

// Refuses, naming the file, a format-3 file coded under other tables than `model`'s.
void check_code_model(const CodesFile& c, const CodeModel& model, const std::string& path);

// What an entropy coder would reach on these codes: the sum over layers of
// the empirical entropy of the layer's codes (bits per code) times the rows,
// in bits per second of audio. `layers` of them (0: all).
double codes_entropy_bitrate(const CodesFile& c, int64_t layers = 0);

// The bits per second the packed codes (ceil(log2 K) bits each, format 2)
// take: the payload, no header. Needs the header only.
double codes_packed_bitrate(const CodesFile& c);

// The ideal length of c's codes under `model`: the sum of -log2 p(code), in bits.
double codes_ideal_bits(const CodesFile& c, const CodeModel& model);

}  // namespace vqddp
