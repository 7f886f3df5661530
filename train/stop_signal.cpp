#include "train/stop_signal.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <ctime>

#include "engine/core/error.h"
#include "engine/core/output_file.h"

namespace vqddp {

namespace {

// Only async-signal-safe work in the handler: a lock-free atomic and write(2).
std::atomic<int> g_received{0};
std::atomic<bool> g_installed{false};
struct sigaction g_old_int, g_old_term;

void write_stderr(const char* text) {
  ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

// A repeat within this long of the first is the same request arriving twice
// (Slurm's scancel signals every process of a job, and vqddp launch
// forwards its own copy), not a second one from the user.
constexpr int64_t kSameRequestNs = 1000000000;
std::atomic<int64_t> g_first_ns{0};

int64_t monotonic_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);  // async-signal-safe
  return int64_t{t.tv_sec} * 1000000000 + t.tv_nsec;
}

void on_stop_signal(int sig) {
  int expected = 0;
  if (g_received.compare_exchange_strong(expected, sig)) {
    g_first_ns = monotonic_ns();
    write_stderr(sig == SIGINT ? "\nvqddp: SIGINT" : "\nvqddp: SIGTERM");
    write_stderr(": finishing the current step, then writing a checkpoint (send it again to stop at once)\n");
    return;
  }
  if (monotonic_ns() - g_first_ns < kSameRequestNs) return;
  // The second one: the default action, now (the exit status says which),
  // without leaving a half-written checkpoint's temporary behind.
  remove_live_temporaries();
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

StopSignalScope::StopSignalScope() {
  VQDDP_CHECK(!g_installed.exchange(true), "a StopSignalScope is already installed in this process");
  g_received = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a read or a wait in progress goes on; the loop polls the flag
  ::sigaction(SIGINT, &sa, &g_old_int);
  ::sigaction(SIGTERM, &sa, &g_old_term);
}

StopSignalScope::~StopSignalScope() {
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGTERM, &g_old_term, nullptr);
  g_installed = false;
}

int stop_signal_received() { return g_received.load(); }

const char* stop_signal_name(int signal) {
  if (signal == SIGINT) return "SIGINT";
  if (signal == SIGTERM) return "SIGTERM";
  return "a signal";
}

}  // namespace vqddp
