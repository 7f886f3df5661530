// vector-quantize-pytorch's in_place_codebook_optimizer on a learnable
// codebook: inside a training forward, before the codes are used, one SGD
// step on the codebook alone for mse(codes, x.detach()), after which the
// rows are assigned again.
//
// DDP (the reference's issue #222: its in-place step used each rank's own
// gradient, so codebooks diverged): the loss is the GLOBAL batch's mean (a
// batch_sum over every rank's rows, over the global row count), so every
// rank's backward() gives the codebook the global gradient and every rank
// steps alike. In an exact step the engine reduces the codebook's gradient
// over the global batch itself (it is a parameter read by batched rows);
// the global count is what makes that sum the mean's gradient (a per-rank
// count fails check-ddp). Outside one the sum's all-reduce does it. SGD without momentum holds no state, so a resumed
// run steps as an uninterrupted one.
#pragma once

#include <vector>

#include "comm/communicator.h"
#include "engine/tensor.h"
#include "vq/codebook.h"

namespace vqddp {

// One in-place step of `book` (learnable) at learning rate `lr` for its
// assignment `a` of this rank's rows. A collective: every rank calls, also
// with no rows.
void in_place_codebook_step(Codebook& book, const CodebookAssignment& a, float lr, Communicator& comm);
// One step for the sum of several assignments' losses (ResidualVQ's shared
// codebook: one per layer, as the reference's layers each add their loss's
// gradient and step once after the last). The codes are looked up again, so
// the step's graph shares nothing with the forward's.
void in_place_codebook_step(Codebook& book, const std::vector<CodebookAssignment>& sets, float lr,
                            Communicator& comm);

}  // namespace vqddp
