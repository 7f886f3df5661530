// Graceful stop on SIGINT and SIGTERM: the first one only records the
// signal, so the training loop can finish the step every rank is in, agree
// through the communicator to stop after it (no rank is left alone in a
// collective), write a checkpoint and say how to resume. A second signal,
// a second or more after the first, stops the process at once with the
// signal's default action (one sooner is the same request delivered twice,
// as when a job scheduler signals every process and the launcher forwards).
// Internal header: not installed with the library (the trainer's signal handling).
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
