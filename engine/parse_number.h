// Whole-string number parsing for command lines, environment variables and
// metadata: the entire text must be the number. (std::stoll alone reads
// "3x" as 3 and strtol skips leading blanks; a value a user mistyped must be
// an error instead.)
#pragma once

#include <charconv>
#include <cstdint>
#include <optional>
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

}  // namespace vqddp
