// A slow link between two network namespaces, for tests/two_nodes.sh: a
// tun device in each (TUN_A in NETNS_A, TUN_B in NETNS_B) and this process
// between them, passing every IP packet from one to the other DELAY_MS
// after it was sent. The kernel here has no netem qdisc, so this relay is
// the delaying link; packets keep their order (one fixed delay per
// direction), so TCP above it sees a long wire. The relay drops none
// itself: a packet is lost only where the kernel drops it (a device's
// queue full because the relay fell behind: the devices' counters) or
// while the far device is not up yet (the caller brings them up one after
// the other), and TCP repairs both, as on a wire.
//
//   delay_link NETNS_A TUN_A NETNS_B TUN_B DELAY_MS
//
// Prints "ready" once both devices exist (the caller then gives them
// addresses and brings them up) and relays until SIGTERM, then prints how
// many packets it passed, the shortest and mean time it held one (so the
// caller can see the link really was slow) and how many a device not yet
// up refused. The devices go with the process.
#include <fcntl.h>
#include <linux/if_tun.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "delay_link: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

// Opens tun device NAME inside network namespace NETNS (as `ip netns`
// names it): the device is made in the namespace the process is in when
// TUNSETIFF runs.
int open_tun(const std::string& netns, const std::string& name) {
  const std::string path = "/run/netns/" + netns;
  const int ns = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (ns < 0) die("cannot open " + path);
  if (::setns(ns, CLONE_NEWNET) != 0) die("cannot enter " + path);
  ::close(ns);
  const int fd = ::open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) die("cannot open /dev/net/tun");
  ifreq req{};
  req.ifr_flags = IFF_TUN | IFF_NO_PI;  // bare IP packets, no ARP
  std::snprintf(req.ifr_name, IFNAMSIZ, "%s", name.c_str());
  if (::ioctl(fd, TUNSETIFF, &req) != 0) die("cannot make tun device " + name + " in " + netns);
  return fd;
}

volatile std::sig_atomic_t stop = 0;

struct Packet {
  Clock::time_point read, due;
  std::vector<char> bytes;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: delay_link NETNS_A TUN_A NETNS_B TUN_B DELAY_MS\n");
    return 2;
  }
  const int fds[2] = {open_tun(argv[1], argv[2]), open_tun(argv[3], argv[4])};
  const auto delay = std::chrono::microseconds(static_cast<long>(std::atof(argv[5]) * 1000));
  struct sigaction on_term {};
  on_term.sa_handler = [](int) { stop = 1; };  // no SA_RESTART: ppoll returns EINTR
  ::sigaction(SIGTERM, &on_term, nullptr);
  // SIGTERM is blocked but inside ppoll, so one sent between the loop's
  // check of `stop` and the wait ends the wait instead of being missed
  // (with both queues empty, a missed one would leave the relay waiting
  // for a packet that never comes).
  sigset_t term, unblocked;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  ::sigprocmask(SIG_BLOCK, &term, &unblocked);
  std::printf("ready\n");
  std::fflush(stdout);

  std::deque<Packet> queue[2];  // queue[i]: read from fds[i], bound for the other side
  std::vector<char> buf(65536);
  long relayed = 0, refused = 0;
  double held_min_ms = 1e30, held_sum_ms = 0;
  while (!stop) {
    // Sleep until a packet arrives or the earliest queued one is due.
    long timeout_ms = -1;
    const auto now = Clock::now();
    for (const auto& q : queue) {
      if (q.empty()) continue;
      const auto wait = std::chrono::ceil<std::chrono::milliseconds>(q.front().due - now).count();
      const long w = wait < 0 ? 0 : static_cast<long>(wait);
      timeout_ms = timeout_ms < 0 ? w : std::min(timeout_ms, w);
    }
    pollfd p[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}};
    timespec ts{timeout_ms / 1000, (timeout_ms % 1000) * 1000000};
    if (::ppoll(p, 2, timeout_ms < 0 ? nullptr : &ts, &unblocked) < 0 && errno != EINTR) die("ppoll");
    for (int i = 0; i < 2; ++i) {
      if (!(p[i].revents & POLLIN)) continue;
      for (;;) {
        const ssize_t n = ::read(fds[i], buf.data(), buf.size());
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
        if (n < 0) die("read");
        const auto now_read = Clock::now();
        queue[i].push_back({now_read, now_read + delay, std::vector<char>(buf.begin(), buf.begin() + n)});
      }
    }
    const auto then = Clock::now();
    for (int i = 0; i < 2; ++i) {
      while (!queue[i].empty() && queue[i].front().due <= then) {
        const auto& b = queue[i].front().bytes;
        // A tun write hands the whole packet to the far namespace's stack
        // (what it drops later is in the device counters, not here); it
        // fails with EIO while that device is not up yet, and the packet is
        // lost, which TCP repairs. EAGAIN is not expected on a tun write
        // and is counted the same way should it come.
        if (::write(fds[1 - i], b.data(), b.size()) < 0) {
          if (errno != EAGAIN && errno != EIO) die("write");
          ++refused;
        }
        const double held = std::chrono::duration<double, std::milli>(Clock::now() - queue[i].front().read).count();
        held_min_ms = std::min(held_min_ms, held);
        held_sum_ms += held;
        ++relayed;
        queue[i].pop_front();
      }
    }
  }
  std::printf("relayed %ld packets, each held at least %.2f ms (mean %.2f ms), %ld refused by a device not up\n",
              relayed, relayed ? held_min_ms : 0.0, relayed ? held_sum_ms / relayed : 0.0, refused);
  return 0;
}
