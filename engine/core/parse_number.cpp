#include "engine/core/parse_number.h"

#include <fmt/format.h>

#include <charconv>
#include <limits>

#include "engine/core/error.h"

namespace vqddp {

std::string CountRange::violation(std::string_view got) const {
  if (hi == std::numeric_limits<int64_t>::max()) return fmt::format("must be at least {}, got {}", lo, got);
  return fmt::format("must be in [{}, {}], got {}", lo, hi, got);
}

int64_t parse_count(std::string_view text, CountRange range, std::string_view what) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  bool whole = !text.empty() && end == text.data() + text.size();
  VQDDP_CHECK(whole && ec != std::errc::invalid_argument, "{} must be an integer, got '{}'", what, text);
  VQDDP_CHECK(ec == std::errc() && range.contains(v), "{} {}", what, range.violation(text));
  return v;
}

}  // namespace vqddp
