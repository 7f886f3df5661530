// The errors a collective can end in. Each names the collective (its kind,
// sequence number and fingerprint) so a log line says which call of which
// rank went wrong.
#pragma once

#include <string>

#include "engine/error.h"

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

// How a group failed, for backends that record a failure in one place and
// raise it in every later call.
enum class CommFailure { aborted, desync, timeout };
[[noreturn]] void throw_comm_failure(CommFailure kind, const std::string& message);

}  // namespace vqddp
