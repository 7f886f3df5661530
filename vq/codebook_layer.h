// One codebook layer's training step, the part VectorQuantize (once per
// codebook: shared by the heads, or one per head) and ResidualVQ (once per
// layer, on its residual) share, so each formula and its order live here
// once:
//   1. assign the rows their nearest codes (or the beam's, `path`);
//   2. with in_place_codebook_optimizer, step the learnable codebook on
//      mse(codes, rows) and assign again (the reference's order), unless
//      the caller defers the step (a shared codebook steps once for all
//      its layers);
//   3. in a training step, the terms that read this step's codes before
//      the update: the codebook diversity loss, the cross-entropy
//      commitment loss, the orthogonal regulariser (each only when on);
//   4. update the codebook (EMA, revival) unless frozen, in inference, or
//      deferred (a shared codebook updates once for all its layers).
// The caller forms the layer's loss and output from what it returns.
// Every rank must call in a training step (each part's collectives are its
// own); nullopt when no rank has rows.
#pragma once

#include <optional>

#include "comm/communicator.h"
#include "vq/codebook.h"
#include "vq/codebook_loss_options.h"

namespace vqddp {

struct CodebookLayerOptions {
  const CodebookLossOptions& loss;  // the terms' weights and switches
  float in_place_lr = 0.f;          // in_place_codebook_optimizer's learning rate (0: off)
  bool training = false;            // a training step (the module's updates_state())
  bool shared = false;              // a shared codebook: in-place step and update deferred to the caller
};

struct CodebookLayerStep {
  CodebookAssignment assignment;  // after the in-place step, when it ran
  CodebookMetrics metrics;        // this update's; empty when nothing updated here
  Tensor diversity;               // the diversity loss (unweighted), when on
  Tensor cross_entropy;           // the cross-entropy commitment term (unweighted), when on
  Tensor orthogonal;              // the orthogonal regulariser (unweighted), when on
};

std::optional<CodebookLayerStep> codebook_layer_step(Codebook& book, const Tensor& rows, Communicator& comm,
                                                     const CodebookLayerOptions& o, const Tensor& path = Tensor());

}  // namespace vqddp
