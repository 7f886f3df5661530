#include "comm/process_launcher.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "comm/dist_env.h"
#include "engine/core/error.h"
#include "engine/core/parse_number.h"

namespace vqddp {

int free_local_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  VQDDP_CHECK(fd >= 0, "launch: socket(): {}", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  VQDDP_CHECK(ok, "launch: cannot find a free port: {}", std::strerror(errno));
  return ntohs(addr.sin_port);
}

namespace {

using Clock = std::chrono::steady_clock;

// How long a process may outlive SIGTERM before it gets SIGKILL.
constexpr auto kKillAfter = std::chrono::seconds(5);

// Process groups of the running children, for forwarding Ctrl-C / SIGTERM
// (each child leads its own group, so its own children are reached too).
std::vector<pid_t> g_children;
// The signal forwarded to them, 0 if none: a child that then exits with
// 128 + it did what was asked (a vqddp rank checkpoints first), and must
// not make the launcher SIGTERM the others, which would be their second
// signal and stop them mid-save.
volatile sig_atomic_t g_forwarded = 0;

void forward_signal(int sig) {
  g_forwarded = sig;
  for (pid_t p : g_children) ::kill(-p, sig);
}

void check_flag(const char* flag, int64_t value, int64_t low, int64_t high) {
  CountRange range{low, high};
  VQDDP_CHECK(range.contains(value), "launch: --{} {}", flag, range.violation(std::to_string(value)));
}

void check_spec(const LaunchSpec& s) {
  check_flag("nproc", s.nproc, 1, kLaunchMaxProcs);
  check_flag("nnodes", s.nnodes, 1, kMaxWorldSize / s.nproc);
  check_flag("node-rank", s.node_rank, 0, s.nnodes - 1);
  check_flag("master-port", s.master_port, 0, 65535);
  VQDDP_CHECK(std::isfinite(s.exit_grace_s) && s.exit_grace_s >= 0,
              "launch: --exit-grace must be a number of seconds >= 0 (0: no limit), got {}", s.exit_grace_s);
  VQDDP_CHECK(!s.command.empty(), "launch: no command to run (usage: vqddp launch --nproc N -- PROGRAM ARGS...)");
  VQDDP_CHECK(s.master_port > 0 || s.nnodes == 1, "launch: --master-port is required with several nodes");
}

// The rendezvous store's token for this node's processes (see
// launch_processes): every node's launcher must hand out the same one.
std::string store_token_for(const LaunchSpec& s) {
  if (const char* t = std::getenv("VQDDP_STORE_TOKEN"); t && *t) return t;
  VQDDP_CHECK(s.nnodes == 1,
              "launch: with --nnodes {} export the same VQDDP_STORE_TOKEN on every node (e.g. "
              "VQDDP_STORE_TOKEN=$(openssl rand -hex 16) in the job script): the rendezvous store refuses requests "
              "without it, and each node would make its own otherwise",
              s.nnodes);
  unsigned char bytes[16];
  VQDDP_CHECK(::getrandom(bytes, sizeof bytes, 0) == static_cast<ssize_t>(sizeof bytes), "launch: getrandom(): {}",
              std::strerror(errno));
  std::string hex;
  for (unsigned char b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
}

struct Child {
  pid_t pid;
  int rank;
  bool running = true;
};

// Reaps the children; see launch_processes for when it stops the others.
int wait_for(std::vector<Child>& children, double exit_grace_s) {
  int result = 0;
  size_t alive = children.size();
  std::optional<Clock::time_point> first_clean, stopped;
  int first_clean_rank = -1;
  bool killed = false;
  auto signal_running = [&](int sig) {
    for (const Child& c : children)
      if (c.running) ::kill(-c.pid, sig);
  };
  while (alive > 0) {
    int status = 0;
    pid_t done = ::waitpid(-1, &status, WNOHANG);
    if (done < 0) {
      if (errno == EINTR) continue;
      break;
    }
    auto now = Clock::now();
    if (done == 0) {
      if (stopped && !killed && now - *stopped > kKillAfter) {
        signal_running(SIGKILL);
        killed = true;
      }
      if (!stopped && first_clean && exit_grace_s > 0 &&
          now - *first_clean > std::chrono::duration<double>(exit_grace_s)) {
        std::vector<int> hung;
        for (const Child& c : children)
          if (c.running) hung.push_back(c.rank);
        fmt::print(stderr,
                   "vqddp launch: rank{} {} still running {:g} s after rank {} exited 0 (hung? see --exit-grace); "
                   "stopping {}\n",
                   hung.size() > 1 ? "s" : "", fmt::join(hung, ", "), exit_grace_s, first_clean_rank,
                   hung.size() > 1 ? "them" : "it");
        result = kLaunchHungExit;
        signal_running(SIGTERM);
        stopped = now;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    auto child = std::find_if(children.begin(), children.end(), [&](const Child& c) { return c.pid == done; });
    if (child == children.end()) continue;
    child->running = false;
    --alive;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code == 0 && !first_clean) {
      first_clean = now;
      first_clean_rank = child->rank;
    }
    if (code != 0 && g_forwarded && code == 128 + g_forwarded) {
      if (result == 0) result = code;
      continue;
    }
    if (code != 0 && result == 0) {
      result = code;
      fmt::print(stderr, "vqddp launch: rank {} (local {}) exited with {}; stopping the others\n", child->rank,
                 child - children.begin(), code);
      signal_running(SIGTERM);
      stopped = now;
    }
  }
  return result;
}

}  // namespace

int launch_processes(const LaunchSpec& s) {
  check_spec(s);
  std::string token = store_token_for(s);
  int port = s.master_port > 0 ? s.master_port : free_local_port();
  int world = s.nproc * s.nnodes;
  // Forward Ctrl-C / SIGTERM to the children from before the first fork:
  // they lead their own process groups, so the terminal's signal would not
  // reach them otherwise.
  g_children.clear();
  g_children.reserve(s.nproc);  // no reallocation under the handler's feet
  g_forwarded = 0;
  struct sigaction forward{}, old_int{}, old_term{};
  forward.sa_handler = forward_signal;
  ::sigaction(SIGINT, &forward, &old_int);
  ::sigaction(SIGTERM, &forward, &old_term);
  std::vector<Child> children;
  for (int local = 0; local < s.nproc; ++local) {
    int rank = s.node_rank * s.nproc + local;
    pid_t pid = ::fork();
    VQDDP_CHECK(pid >= 0, "launch: fork failed: {}", std::strerror(errno));
    if (pid == 0) {
      ::setpgid(0, 0);
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(s.nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", s.master_addr.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("VQDDP_STORE_TOKEN", token.c_str(), 1);
      std::vector<char*> argv;
      for (const std::string& a : s.command) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execvp(argv[0], argv.data());
      std::fprintf(stderr, "vqddp launch: cannot run %s: %s\n", argv[0], std::strerror(errno));
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also here: no race with the child's own call
    children.push_back({pid, rank});
    g_children.push_back(pid);
  }
  int result = wait_for(children, s.exit_grace_s);
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  g_children.clear();
  return result;
}

}  // namespace vqddp
