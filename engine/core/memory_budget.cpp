#include "engine/core/memory_budget.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "engine/core/error.h"
#include "engine/core/parse_number.h"

namespace vqddp {

int64_t available_memory_bytes() {
  if (const char* v = std::getenv("VQDDP_MEMORY_AVAILABLE")) {
    std::optional<int64_t> n = parse_int(v);
    VQDDP_CHECK(n && *n >= 0, "VQDDP_MEMORY_AVAILABLE is '{}', not a number of bytes", v);
    return *n;
  }
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string key;
    int64_t kib = -1;
    if (words >> key >> kib && key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

void require_memory(int64_t bytes, const std::string& what, const std::string& purpose) {
  const int64_t have = available_memory_bytes();
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  VQDDP_CHECK(have < 0 || bytes <= have, "{}: needs about {:.2f} GiB of memory for {}, and {:.2f} GiB are available",
              what, static_cast<double>(bytes) / kGiB, purpose, static_cast<double>(have) / kGiB);
}

}  // namespace vqddp
