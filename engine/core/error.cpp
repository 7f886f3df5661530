#include "engine/core/error.h"

#include <cstring>

namespace vqddp {

std::string source_position(const char* file, int line) {
  // Only the path below the source root: the build directory's location
  // (../../../<checkout>/) says nothing to anyone.
  const char* shown = file;
  for (const char* root : {"tests/", "bench/", "examples/", "engine/", "comm/", "vq/", "train/", "data/", "tool/"}) {
    if (const char* p = std::strstr(file, root)) {
      shown = p;
      break;
    }
  }
  return fmt::format("{}:{}", shown, line);
}

void throw_error(const char* file, int line, const std::string& message) {
  throw Error(message, source_position(file, line));
}

void throw_internal_error(const char* file, int line, const std::string& message) {
  std::string where = source_position(file, line);
  throw Error(fmt::format("internal error at {}: {} (a bug in vqddp: please report it with this message)", where,
                          message),
              where);
}

}  // namespace vqddp
