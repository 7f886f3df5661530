#include "engine/error.h"

#include <cstring>

namespace vqddp {

std::string error_text(const char* file, int line, const std::string& message) {
  // Keep only the path below the source root so messages are stable across
  // build directories.
  const char* shown = file;
  for (const char* root : {"tests/", "bench/", "examples/", "engine/", "comm/", "vq/", "train/"}) {
    if (const char* p = std::strstr(file, root)) {
      shown = p;
      break;
    }
  }
  return fmt::format("{}:{}: {}", shown, line, message);
}

void throw_error(const char* file, int line, const std::string& message) {
  throw Error(error_text(file, line, message));
}

}  // namespace vqddp
