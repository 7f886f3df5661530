// vector-quantize-pytorch's in_place_codebook_optimizer on a learnable
// codebook: inside a training forward, before the codes are used, one SGD
// step on the codebook alone for mse(codes, x.detach()), after which the
// rows are assigned again.
//
// DDP (the reference's issue #222: its in-place step used each rank's own
// gradient, so codebooks diverged): the loss is the GLOBAL batch's mean (a
// batch_sum over every rank's rows, over the global row count), and its
// backward runs in an exact step, so the codebook's gradient is the global
// batch's, bit for bit 1 rank's: the trainer's step, or outside one (a
// caller's own loop) a step of its own with one unit per row. (Outside an
// exact step the sum's all-reduce alone gave each rank only its rows'
// share of the gradient: ranks stepped apart, by about 2e-4 here.) SGD
// without momentum holds no state, so a resumed run steps as an
// uninterrupted one.
#pragma once

#include <vector>

#include "comm/communicator.h"
#include "engine/core/tensor.h"
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
