#include "comm/fingerprint.h"

#include <fmt/format.h>

namespace vqddp {

std::string Fingerprint::str() const {
  if (kind == "barrier") return kind;
  std::string s = fmt::format("{} {} x{}", kind, dtype_name(dtype), numel);
  if (root >= 0) s += fmt::format(" root={}", root);
  if (!counts.empty()) s += fmt::format(" rows=[{}]", fmt::join(counts, ","));
  return s;
}

}  // namespace vqddp
