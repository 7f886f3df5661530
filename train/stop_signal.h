// Graceful stop on SIGINT and SIGTERM: the first one only records the
// signal, so the training loop can finish the step every rank is in, agree
// through the communicator to stop after it (no rank is left alone in a
// collective), write a checkpoint and say how to resume. A second signal
// stops the process at once, with the signal's default action.
#pragma once

namespace vqddp {

// Installs the handlers for the scope's lifetime and restores the previous
// ones after. One at a time per process.
class StopSignalScope {
 public:
  StopSignalScope();
  ~StopSignalScope();
  StopSignalScope(const StopSignalScope&) = delete;
  StopSignalScope& operator=(const StopSignalScope&) = delete;
};

// The first SIGINT/SIGTERM received while a StopSignalScope is alive, or 0.
int stop_signal_received();

// "SIGINT", "SIGTERM", or "a signal".
const char* stop_signal_name(int signal);

}  // namespace vqddp
