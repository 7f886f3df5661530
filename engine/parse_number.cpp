#include "engine/parse_number.h"

#include <fmt/format.h>

#include <limits>

namespace vqddp {

std::string CountRange::violation(std::string_view got) const {
  if (hi == std::numeric_limits<int64_t>::max()) return fmt::format("must be at least {}, got {}", lo, got);
  return fmt::format("must be in [{}, {}], got {}", lo, hi, got);
}

}  // namespace vqddp
