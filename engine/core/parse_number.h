// Whole-string number parsing for command lines, environment variables and
// metadata: the entire text must be the number. (std::stoll alone reads
// "3x" as 3 and strtol skips leading blanks; a value a user mistyped must be
// an error instead.)
#pragma once

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace vqddp {

inline std::optional<int64_t> parse_int(std::string_view text) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

inline std::optional<double> parse_double(std::string_view text) {
  double v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

// The allowed values of a count (a world size, a number of steps, a codebook
// size), inclusive. Every count a user gives is read as 64 bits and checked
// against its range before it is narrowed or used, so 4294967298 ranks is an
// error instead of 2 ranks.
struct CountRange {
  int64_t lo, hi;
  bool contains(int64_t v) const { return v >= lo && v <= hi; }
  // "must be in [1, 1024], got 4294967298" (or "must be at least 1, ..."
  // when there is no upper limit worth naming).
  std::string violation(std::string_view got) const;
};

// `text` as an integer within `range`, for every count read from text (flags,
// environment variables, metadata): one rule, one wording. Throws an Error
// "<what> must be an integer, got 'x'" or "<what> must be in [lo, hi], got
// <text>"; digits beyond int64 are a range error, not a wrapped value.
int64_t parse_count(std::string_view text, CountRange range, std::string_view what);

}  // namespace vqddp
