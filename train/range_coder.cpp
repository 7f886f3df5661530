#include "train/range_coder.h"

#include <algorithm>

#include "engine/core/error.h"

namespace vqddp {

namespace {
constexpr uint32_t kTop = uint32_t{1} << 24;  // range stays >= 2^24 between symbols
}

FrequencyTable::FrequencyTable(std::vector<uint32_t> freqs) : freq(std::move(freqs)) {
  VQDDP_CHECK(!freq.empty() && freq.size() <= kTotal, "a frequency table of {} symbols (1 to {})", freq.size(), kTotal);
  cum.assign(freq.size() + 1, 0);
  for (size_t s = 0; s < freq.size(); ++s) {
    VQDDP_CHECK(freq[s] >= 1 && freq[s] <= kTotal, "symbol {} has frequency {}: every symbol needs 1 to {}", s,
                freq[s], kTotal);
    cum[s + 1] = cum[s] + freq[s];
    VQDDP_CHECK(cum[s + 1] <= kTotal, "a frequency table sums past {}", kTotal);
  }
  VQDDP_CHECK(cum.back() == kTotal, "a frequency table sums to {}, not {}", cum.back(), kTotal);
}

uint32_t FrequencyTable::find(uint32_t v) const {
  // The last s with cum[s] <= v.
  return static_cast<uint32_t>(std::upper_bound(cum.begin(), cum.end(), v) - cum.begin() - 1);
}

void RangeEncoder::shift_low() {
  // low < 2^32 + 2^32: bit 32 is a carry into the bytes held back.
  if (low_ < 0xff000000u || low_ >= (uint64_t{1} << 32)) {
    const uint8_t carry = static_cast<uint8_t>(low_ >> 32);
    uint8_t byte = cache_;
    do {
      if (!first_) out_.push_back(static_cast<char>(static_cast<uint8_t>(byte + carry)));
      first_ = false;
      byte = 0xff;
    } while (--pending_ != 0);
    cache_ = static_cast<uint8_t>(low_ >> 24);
  }
  ++pending_;
  low_ = (low_ & 0x00ffffffu) << 8;
}

void RangeEncoder::put(uint32_t cum, uint32_t freq, int total_bits) {
  const uint32_t r = range_ >> total_bits;
  low_ += static_cast<uint64_t>(r) * cum;
  range_ = r * freq;
  while (range_ < kTop) {
    range_ <<= 8;
    shift_low();
  }
}

void RangeEncoder::encode(const FrequencyTable& t, uint32_t symbol) {
  VQDDP_CHECK(symbol < t.freq.size(), "range coder: symbol {} of a table of {}", symbol, t.freq.size());
  put(t.cum[symbol], t.freq[symbol], kTotalBits);
}

void RangeEncoder::encode_bits(uint32_t value, int bits) {
  VQDDP_CHECK(bits >= 0 && bits <= 16 && (value >> bits) == 0, "range coder: {} in {} raw bits", value, bits);
  if (bits > 0) put(value, 1, bits);
}

std::string RangeEncoder::finish() {
  // Any value in [low, low + range) decodes the same: the one with the most
  // trailing zero bits, whose zero bytes are then not written.
  for (int k = 32; k > 0; --k) {
    const uint64_t mask = (uint64_t{1} << k) - 1, v = (low_ + mask) & ~mask;
    if (v < low_ + range_) {
      low_ = v;
      break;
    }
  }
  for (int i = 0; i < 5; ++i) shift_low();
  // The decoder reads zeros past the end, so the zero bytes the final value
  // ends with need not be written: at most its 4 bytes. Zeros before them
  // are codes' bits (a run of the most probable code under uniform tables
  // is all zeros), which the reader's bound on a chunk's rows counts on.
  for (int i = 0; i < 4 && !out_.empty() && out_.back() == '\0'; ++i) out_.pop_back();
  return std::move(out_);
}

RangeDecoder::RangeDecoder(const unsigned char* data, size_t size) : data_(data), size_(size) {
  for (int i = 0; i < 4; ++i) code_ = (code_ << 8) | next();
}

void RangeDecoder::take(uint32_t cum, uint32_t freq, int total_bits) {
  const uint32_t r = range_ >> total_bits;
  code_ -= r * cum;
  range_ = r * freq;
  while (range_ < kTop) {
    range_ <<= 8;
    code_ = (code_ << 8) | next();
  }
}

uint32_t RangeDecoder::decode(const FrequencyTable& t) {
  const uint32_t r = range_ >> kTotalBits;
  // A damaged stream can put code past the range: clamp, so the symbol is
  // still one of the table's (and code >= r * cum holds).
  const uint32_t v = std::min(code_ / r, kTotal - 1);
  const uint32_t s = t.find(v);
  take(t.cum[s], t.freq[s], kTotalBits);
  return s;
}

uint32_t RangeDecoder::decode_bits(int bits) {
  if (bits == 0) return 0;
  const uint32_t r = range_ >> bits;
  const uint32_t v = std::min(code_ / r, (uint32_t{1} << bits) - 1);
  take(v, 1, bits);
  return v;
}

}  // namespace vqddp
