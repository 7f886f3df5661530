#include "comm/launcher.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "engine/error.h"

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

// Process groups of the running children, for forwarding Ctrl-C / SIGTERM
// (each child leads its own group, so its own children are reached too).
std::vector<pid_t> g_children;

void forward_signal(int sig) {
  for (pid_t p : g_children) ::kill(-p, sig);
}

}  // namespace

int launch_processes(const LaunchSpec& s) {
  VQDDP_CHECK(s.nproc >= 1 && s.nnodes >= 1 && s.node_rank >= 0 && s.node_rank < s.nnodes,
              "launch: need nproc >= 1 and 0 <= node_rank < nnodes (got {}, {}, {})", s.nproc, s.node_rank, s.nnodes);
  VQDDP_CHECK(!s.command.empty(), "launch: no command to run (usage: vqddp launch --nproc N -- PROGRAM ARGS...)");
  VQDDP_CHECK(s.master_port > 0 || s.nnodes == 1, "launch: --master-port is required with several nodes");
  int port = s.master_port > 0 ? s.master_port : free_local_port();
  int world = s.nproc * s.nnodes;
  // Forward Ctrl-C / SIGTERM to the children from before the first fork:
  // they lead their own process groups, so the terminal's signal would not
  // reach them otherwise.
  g_children.clear();
  struct sigaction forward{}, old_int{}, old_term{};
  forward.sa_handler = forward_signal;
  ::sigaction(SIGINT, &forward, &old_int);
  ::sigaction(SIGTERM, &forward, &old_term);
  std::vector<pid_t> pids;
  for (int local = 0; local < s.nproc; ++local) {
    pid_t pid = ::fork();
    VQDDP_CHECK(pid >= 0, "launch: fork failed: {}", std::strerror(errno));
    if (pid == 0) {
      ::setpgid(0, 0);
      int rank = s.node_rank * s.nproc + local;
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(s.nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", s.master_addr.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      std::vector<char*> argv;
      for (const std::string& a : s.command) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execvp(argv[0], argv.data());
      std::fprintf(stderr, "vqddp launch: cannot run %s: %s\n", argv[0], std::strerror(errno));
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also here: no race with the child's own call
    pids.push_back(pid);
    g_children.push_back(pid);
  }
  int result = 0;
  size_t alive = pids.size();
  std::vector<char> reaped(pids.size(), 0);
  auto stopped_at = std::chrono::steady_clock::time_point::max();
  while (alive > 0) {
    int status = 0;
    pid_t done = ::waitpid(-1, &status, WNOHANG);
    if (done == 0) {
      // A rank that ignores SIGTERM for 10 s after a failure gets SIGKILL.
      if (std::chrono::steady_clock::now() - stopped_at > std::chrono::seconds(10))
        for (size_t i = 0; i < pids.size(); ++i)
          if (!reaped[i]) ::kill(-pids[i], SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    if (done < 0) {
      if (errno == EINTR) continue;
      break;
    }
    --alive;
    int local = static_cast<int>(std::find(pids.begin(), pids.end(), done) - pids.begin());
    if (local < static_cast<int>(pids.size())) reaped[local] = 1;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && result == 0) {
      result = code;
      fmt::print(stderr, "vqddp launch: rank {} (local {}) exited with {}; stopping the others\n",
                 s.node_rank * s.nproc + local, local, code);
      for (size_t i = 0; i < pids.size(); ++i)
        if (!reaped[i]) ::kill(-pids[i], SIGTERM);
      stopped_at = std::chrono::steady_clock::now();
    }
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  g_children.clear();
  return result;
}

}  // namespace vqddp
