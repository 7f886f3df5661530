// The errors a collective can end in. Each names the collective (its kind,
// sequence number and fingerprint) so a log line says which call of which
// rank went wrong.
#pragma once

#include <string>

#include "engine/core/error.h"

namespace vqddp {

// Ranks called different collectives (or the same with different
// arguments) at the same sequence number.
class DesyncError : public Error {
 public:
  using Error::Error;
};

// A rank did not arrive at a collective before the deadline.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// The group was aborted because another rank failed; raised in every later
// call too.
class AbortedError : public Error {
 public:
  using Error::Error;
};

// What every rank raised at the same point of the program, with the same
// message: agree_outcome(), or a check of values gathered from every rank
// (VQDDP_CHECK_EVERY_RANK: other data, another config or build). The ranks
// still agree on what comes next, so a backend that ends the whole job at
// once after a rank-local error (MPI: MPI_Abort) can let each process end
// on its own instead.
class RanksAgreed {
 public:
  virtual ~RanksAgreed() = default;
};

class AgreedError : public Error, public RanksAgreed {
 public:
  using Error::Error;
};

class AgreedNonFiniteError : public NonFiniteError, public RanksAgreed {
 public:
  using NonFiniteError::NonFiniteError;
};

// True for an error every rank raised alike (a RanksAgreed).
bool raised_by_every_rank(const std::exception& e);

// Re-raises a NonFiniteError `cause` with more context in `message`: an
// AgreedNonFiniteError if every rank raised the cause alike, so the context
// a caller adds does not drop that.
[[noreturn]] void rethrow_nonfinite(const NonFiniteError& cause, const std::string& message);

// How a group failed, for backends that record a failure in one place and
// raise it in every later call.
enum class CommFailure { aborted, desync, timeout };
[[noreturn]] void throw_comm_failure(CommFailure kind, const std::string& message);

}  // namespace vqddp
