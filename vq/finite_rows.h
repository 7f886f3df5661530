// Non-finite rows refused on every rank alike, for quantizers with no
// collective of their own to carry the flag (FSQ, ResidualFSQ). A rank that
// threw alone would leave the others waiting in their next collective (the
// backward's gradient reduction) until the timeout; instead every rank
// adds its flag to one all-reduce and all throw the same NonFiniteError,
// naming each rank, row and column that holds one (the Codebook does the
// same within its statistics: vq/code_stats.h).
//
// On the host only, where the check is free next to the collective. On a
// device it is skipped (a read per call would make every step wait): the
// NaN reaches the loss, which the trainer reads on every rank alike when it
// logs.
// Internal header: not installed with the library (the quantizers' input check).
#pragma once

#include <string>

#include "comm/communicator.h"

namespace vqddp {

// Every rank must call (on the host: one all_reduce of W doubles). `input`
// names the rows in the message ("FSQ's input").
void refuse_nonfinite_rows(const Tensor& x, Communicator& comm, const std::string& input);

}  // namespace vqddp
