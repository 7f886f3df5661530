// Rank-local outcomes made common. A check that only one rank can make (rank
// 0 preparing the run directory, a rank whose data differs) must not end in
// that rank throwing while the others wait in their next collective until
// the timeout: every rank calls agree_outcome() at the same point with what
// it found, and if any rank failed, every rank throws the same error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/errors.h"
#include "engine/core/error.h"

namespace vqddp {

// `failure` is this rank's error message ("" when it is fine). Every rank
// must call. When some rank failed, every rank throws AgreedError("rank R: ...")
// with the message of the lowest failing rank R (cut at 4000 bytes), and
// says how many other ranks failed too; an AgreedNonFiniteError when that
// rank's was a NonFiniteError (`nonfinite`), so callers that add the step and the data's origin
// to those still can. Costs one all_reduce when all are fine, one broadcast
// more when not.
void agree_outcome(Communicator& comm, const std::string& failure, bool nonfinite = false);

// Runs `f` on this rank (every rank, or only where `here` is true), catching
// a vqddp::Error into agree_outcome().
template <class F>
void agree_on(Communicator& comm, bool here, F&& f) {
  std::string failure;
  bool nonfinite = false;
  if (here) {
    try {
      f();
    } catch (const NonFiniteError& e) {
      failure = e.what();
      nonfinite = true;
      if (failure.empty()) failure = "failed";
    } catch (const Error& e) {
      failure = e.what();
      if (failure.empty()) failure = "failed";
    }
  }
  agree_outcome(comm, failure, nonfinite);
}

// Every rank's `values` (the same length on every rank), gathered: row r is
// rank r's. For cross-checks that must fail on every rank alike.
std::vector<std::vector<int64_t>> gather_values(Communicator& comm, const std::vector<int64_t>& values);

}  // namespace vqddp

// VQDDP_THROW_NONFINITE for a non-finite value every rank finds alike (in
// flags or a loss reduced over the ranks): an AgreedNonFiniteError.
#define VQDDP_THROW_NONFINITE_EVERY_RANK(...) \
  throw ::vqddp::AgreedNonFiniteError(::fmt::format(__VA_ARGS__), ::vqddp::source_position(__FILE__, __LINE__))

// VQDDP_CHECK for a check every rank makes on the same gathered values (so
// every rank fails it alike): it throws AgreedError, which tells the
// backends that no rank is left waiting in a collective.
#define VQDDP_CHECK_EVERY_RANK(cond, ...)                                                                      \
  do {                                                                                                          \
    if (!(cond))                                                                                                \
      throw ::vqddp::AgreedError(::fmt::format(__VA_ARGS__), ::vqddp::source_position(__FILE__, __LINE__)); \
  } while (0)
