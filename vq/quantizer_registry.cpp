#include "vq/quantizer_registry.h"

#include <fmt/format.h>

namespace vqddp {

const std::vector<const QuantizerKind*>& quantizer_kinds() {
#define VQDDP_KIND_ENTRY(kind) &kind(),
  static const std::vector<const QuantizerKind*> kinds{VQDDP_QUANTIZER_KINDS(VQDDP_KIND_ENTRY)};
#undef VQDDP_KIND_ENTRY
  return kinds;
}

const QuantizerKind& quantizer_kind(const std::string& type) {
  for (const QuantizerKind* k : quantizer_kinds())
    if (k->type == type) return *k;
  VQDDP_THROW("unknown quantizer type \"{}\" (known: {})", type, fmt::join(quantizer_types(), ", "));
}

}  // namespace vqddp
