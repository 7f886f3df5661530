// The options every suite gives each quantizer type: the type's own
// test_keys (vq/quantizer_kind.h: k-means init, revival and quantize
// dropout where the type has them, small sizes), so a type added to the
// registry is tested everywhere alike: the DDP traces
// (tests/vq/quantizer_trace.h) and the device cases
// (tests/vq/quantizer_cases.h). `more` adds or replaces keys.
#pragma once

#include <string>

#include "vq/quantizer_kind.h"
#include "vq/quantizer_options.h"

namespace vqddp::test {

inline QuantizerOptions options_for(const std::string& type, const nlohmann::json& more = nlohmann::json::object()) {
  nlohmann::json j = quantizer_kind(type).test_keys;
  j["type"] = type;
  for (const auto& [key, value] : more.items()) j[key] = value;
  return parse_quantizer_options(j, 0, "options_for(\"" + type + "\")");
}

}  // namespace vqddp::test
