#include "vq/quantize_dropout.h"

#include <algorithm>

#include "engine/core/streams.h"
#include "engine/step_graph.h"

namespace vqddp {

int last_active_layer(const QuantizeDropoutOptions& opt, int q, bool update_mode, uint64_t seed, Tensor& step) {
  VQDDP_CHECK(opt.cutoff_index >= 0 && opt.cutoff_index < q && opt.multiple_of >= 1,
              "quantize dropout: cutoff_index {} must be in [0, {}) and multiple_of {} positive", opt.cutoff_index, q,
              opt.multiple_of);
  if (!opt.enabled || !update_mode) return q - 1;
  int64_t& counter = step.data<int64_t>()[0];
  Generator gen(opt.seed.value_or(seed), streams::kQuantizeDropout + static_cast<uint64_t>(counter));  // a fresh stream per step
  ++counter;
  step.bump_version();
  int last = opt.cutoff_index + static_cast<int>(gen.uniform_int(static_cast<uint64_t>(q - opt.cutoff_index)));
  if (opt.multiple_of > 1) last = (last + 1 + opt.multiple_of - 1) / opt.multiple_of * opt.multiple_of - 1;
  last = std::min(last, q - 1);
  note_step_variant("quantize_dropout", last);  // one step sequence per number of layers
  return last;
}

}  // namespace vqddp
