// The errors a collective can end in. Each names the collective (its kind,
// sequence number and fingerprint) so a log line says which call of which
// rank went wrong.
#pragma once

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

}  // namespace vqddp
