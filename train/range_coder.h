// Internal header: not installed (the codes file's entropy coder, train/codes_file.cpp).
//
// A 32-bit range coder (Martin 1979; the carry handling of LZMA's coder:
// `low` kept in 33 bits, a pending byte and a run of 0xff bytes held back
// until a carry can no longer reach them) over static frequency tables
// whose totals are 2^kTotalBits. A symbol of frequency f costs
// log2(2^16 / f) bits plus at most 2^-7 bits of truncation (range >= 2^24,
// so range >> 16 >= 256); a stream costs its symbols plus at most 5 bytes.
// The first byte LZMA emits (always 0) is not written, and trailing zero
// bytes are dropped: the decoder reads zeros past the end, so the stream
// decodes the same. The decoder never reads outside its buffer and,
// whatever the bytes, returns a symbol inside the table (a damaged stream
// decodes to wrong symbols, never to undefined behaviour: checksums are
// the codes file's business).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vqddp {

inline constexpr int kTotalBits = 16;
inline constexpr uint32_t kTotal = uint32_t{1} << kTotalBits;

// A static table: freq[s] >= 1 for each of the K symbols, summing to
// kTotal (so 1 <= K <= 2^16); cum[s] = freq[0] + ... + freq[s-1], K + 1 entries.
struct FrequencyTable {
  std::vector<uint32_t> freq, cum;
  FrequencyTable() = default;
  explicit FrequencyTable(std::vector<uint32_t> freqs);  // checks the above
  int64_t size() const { return static_cast<int64_t>(freq.size()); }
  // The symbol s with cum[s] <= v < cum[s + 1] (v < kTotal).
  uint32_t find(uint32_t v) const;
};

class RangeEncoder {
 public:
  void encode(const FrequencyTable& t, uint32_t symbol);
  // `bits` (<= 16) raw bits of `value`, each value equally likely.
  void encode_bits(uint32_t value, int bits);
  // The bytes; the encoder is spent.
  std::string finish();

 private:
  void put(uint32_t cum, uint32_t freq, int total_bits);
  void shift_low();
  uint64_t low_ = 0;
  uint32_t range_ = 0xffffffffu;
  uint8_t cache_ = 0;
  uint64_t pending_ = 1;  // the cache byte and the 0xff bytes after it, not yet written
  bool first_ = true;     // the first byte out is always 0: not written
  std::string out_;
};

class RangeDecoder {
 public:
  RangeDecoder(const unsigned char* data, size_t size);
  uint32_t decode(const FrequencyTable& t);
  uint32_t decode_bits(int bits);

 private:
  uint8_t next() { return at_ < size_ ? data_[at_++] : (++at_, 0); }
  void take(uint32_t cum, uint32_t freq, int total_bits);
  const unsigned char* data_;
  size_t size_, at_ = 0;
  uint32_t code_ = 0, range_ = 0xffffffffu;
};

}  // namespace vqddp
