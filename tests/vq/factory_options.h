// The options every suite gives each factory type (vq/quantizer_options.h),
// shared so a type added to quantizer_types() is tested everywhere alike:
// the DDP traces (tests/vq/quantizer_trace.h) and the device cases
// (tests/vq/quantizer_cases.h).
#pragma once

#include <string>

#include "vq/quantizer_options.h"

namespace vqddp::test {

inline constexpr int kLayers = 3;

// Options that exercise each type's state: k-means init, revival and
// quantize dropout where the type has them.
inline QuantizerOptions options_for(const std::string& type) {
  QuantizerOptions q;
  q.type = type;
  q.codebook_size = 16;
  q.num_quantizers = kLayers;
  q.codebook.kmeans_init = true;
  q.codebook.kmeans_iters = 3;
  q.codebook.threshold_ema_dead_code = 1.5f;
  q.quantize_dropout = true;
  if (type.ends_with("fsq") || type == "fsp" || type == "latent_quantize") q.levels = {5, 4, 3};
  if (type.starts_with("grouped_")) q.groups = 2;
  return q;
}

}  // namespace vqddp::test
