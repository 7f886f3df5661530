// The quantizer types vqddp knows: one line each, in the order errors and
// docs list them. Each names the function, defined in the type's own .cpp,
// that returns its QuantizerKind (vq/quantizer_kind.h). Adding a quantizer
// is its header, its .cpp (the class and its kind) and one line here.
// Internal header: not installed with the library (the list of kinds (a new type is a line there, in the source)).
#pragma once

#include "vq/quantizer_kind.h"

#define VQDDP_QUANTIZER_KINDS(X)  \
  X(vector_quantize_kind)         \
  X(residual_vq_kind)             \
  X(fsq_kind)                     \
  X(residual_fsq_kind)            \
  X(lfq_kind)                     \
  X(residual_lfq_kind)            \
  X(sim_vq_kind)                  \
  X(residual_sim_vq_kind)         \
  X(grouped_residual_vq_kind)     \
  X(grouped_residual_fsq_kind)    \
  X(grouped_residual_lfq_kind)    \
  X(fsp_kind)                     \
  X(latent_quantize_kind)         \
  X(random_projection_kind)

namespace vqddp {

#define VQDDP_DECLARE_KIND(kind) const QuantizerKind& kind();
VQDDP_QUANTIZER_KINDS(VQDDP_DECLARE_KIND)
#undef VQDDP_DECLARE_KIND

}  // namespace vqddp
