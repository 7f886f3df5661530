#include "comm/errors.h"

namespace vqddp {

bool raised_by_every_rank(const std::exception& e) { return dynamic_cast<const RanksAgreed*>(&e) != nullptr; }

void rethrow_nonfinite(const NonFiniteError& cause, const std::string& message) {
  if (raised_by_every_rank(cause)) throw AgreedNonFiniteError(message, cause.where());
  throw NonFiniteError(message, cause.where());
}

void throw_comm_failure(CommFailure kind, const std::string& message) {
  switch (kind) {
    case CommFailure::desync: throw DesyncError(message);
    case CommFailure::timeout: throw TimeoutError(message);
    case CommFailure::aborted: break;
  }
  throw AbortedError(message);
}

}  // namespace vqddp
