#include "comm/store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <string_view>

#include "comm/errors.h"
#include "engine/core/file_io.h"
#include "engine/core/output_file.h"

namespace vqddp {

namespace {

using Clock = std::chrono::steady_clock;

void put_u32(std::string& out, size_t n) {
  for (int i = 0; i < 4; ++i) out += static_cast<char>((n >> (8 * i)) & 0xff);
}

uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(p[i]);
  return v;
}

void put_field(std::string& out, std::string_view s) {
  put_u32(out, s.size());
  out.append(s);
}

// ---- addresses ----

// One address of a host, copied out of getaddrinfo's list.
struct Address {
  sockaddr_storage sa{};
  socklen_t len = 0;
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&sa); }
};

// The distinct addresses `host` names, with `port`; none, and why, when it
// does not resolve.
std::vector<Address> resolve(const std::string& host, int port, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::vector<Address> out;
  if (int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    error = ::gai_strerror(rc);
    return out;
  }
  for (addrinfo* a = res; a; a = a->ai_next) {
    Address x;
    std::memcpy(&x.sa, a->ai_addr, a->ai_addrlen);
    x.len = a->ai_addrlen;
    if (std::none_of(out.begin(), out.end(),
                     [&](const Address& y) { return y.len == x.len && std::memcmp(&y.sa, &x.sa, x.len) == 0; }))
      out.push_back(x);
  }
  ::freeaddrinfo(res);
  return out;
}

void set_port(Address& a, int port) {
  uint16_t p = htons(static_cast<uint16_t>(port));
  if (a.sa.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&a.sa)->sin6_port = p;
  else reinterpret_cast<sockaddr_in*>(&a.sa)->sin_port = p;
}

bool is_loopback(const Address& a) {
  if (a.sa.ss_family == AF_INET)
    return ntohl(reinterpret_cast<const sockaddr_in*>(&a.sa)->sin_addr.s_addr) >> 24 == 127;
  if (a.sa.ss_family == AF_INET6) {
    const in6_addr& x = reinterpret_cast<const sockaddr_in6*>(&a.sa)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&x) || (IN6_IS_ADDR_V4MAPPED(&x) && x.s6_addr[12] == 127);
  }
  return false;
}

// Without a token anyone who reaches the port could write the rendezvous;
// only processes of this machine reach a loopback address (TcpStoreOptions).
void check_token_needed(const std::vector<Address>& addrs, const std::string& token, const std::string& host) {
  if (!token.empty()) return;
  for (const Address& a : addrs)
    VQDDP_CHECK(is_loopback(a),
                "store: no token is set and {} is not a loopback address, so anyone who can reach it could write the "
                "rendezvous: export the same random VQDDP_STORE_TOKEN on every node (e.g. "
                "VQDDP_STORE_TOKEN=$(openssl rand -hex 16); `vqddp launch` makes one on a single node)",
                host);
}

// ---- client side: blocking I/O bounded by SO_RCVTIMEO / SO_SNDTIMEO ----

enum class Io { ok, closed, timed_out };

void set_io_timeout(int fd, std::chrono::milliseconds t) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(std::max<int64_t>(t.count(), 1) / 1000);
  tv.tv_usec = static_cast<suseconds_t>(std::max<int64_t>(t.count(), 1) % 1000 * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

Io io_result(ssize_t r) {
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINPROGRESS)) return Io::timed_out;
  return Io::closed;
}

Io send_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return io_result(w);
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Io::ok;
}

Io recv_all(int fd, char* p, size_t n) {
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return io_result(r);
    p += r;
    n -= static_cast<size_t>(r);
  }
  return Io::ok;
}

std::string doing(char op, const std::string& key) {
  if (op == 'P') return "checking its token";
  return fmt::format("{} '{}'", op == 'S' ? "setting" : "reading", key);
}

// ---- server side ----

// Equal without an early exit, so reply timings do not reveal how many
// leading bytes of a guess were right (the length is no secret).
bool tokens_equal(std::string_view got, std::string_view want) {
  unsigned diff = got.size() != want.size();
  for (size_t i = 0; i < want.size(); ++i)
    diff |= static_cast<unsigned char>(want[i]) ^ static_cast<unsigned char>(i < got.size() ? got[i] : 0);
  return diff == 0;
}

struct Request {
  char op = 0;
  std::string_view key, value;
  size_t size = 0;  // bytes of the message
};

enum class Parsed { incomplete, done, refused };

// One request from the start of `in`. Each length is checked against its
// cap as soon as its 4 bytes are in, and the token before anything after
// it, so the server never buffers more than one chunk past a bad prefix,
// and a client without the token no more than a token's worth.
Parsed parse_request(std::string_view in, const std::string& token, Request& r) {
  size_t pos = 0;
  auto field = [&](size_t cap, std::string_view& f) {
    if (in.size() < pos + 4) return Parsed::incomplete;
    size_t n = get_u32(in.data() + pos);
    if (n > cap) return Parsed::refused;
    if (in.size() < pos + 4 + n) return Parsed::incomplete;
    f = in.substr(pos + 4, n);
    pos += 4 + n;
    return Parsed::done;
  };
  std::string_view got;
  if (Parsed p = field(kStoreMaxToken, got); p != Parsed::done) return p;
  if (!tokens_equal(got, token)) return Parsed::refused;
  if (in.size() < pos + 1) return Parsed::incomplete;
  r.op = in[pos++];
  if (r.op != 'S' && r.op != 'G' && r.op != 'P') return Parsed::refused;
  if (Parsed p = field(kStoreMaxKey, r.key); p != Parsed::done) return p;
  if (Parsed p = field(kStoreMaxValue, r.value); p != Parsed::done) return p;
  r.size = pos;
  return Parsed::done;
}

using Data = std::map<std::string, std::string, std::less<>>;

void answer(const Request& r, Data& data, std::string& out) {
  if (r.op == 'S') data[std::string(r.key)] = r.value;
  auto it = r.op == 'G' ? data.find(r.key) : data.end();
  out += static_cast<char>(r.op != 'G' || it != data.end());
  if (it != data.end()) put_field(out, it->second);
}

// A client connection of the server. It is busy from its accept until its
// first complete request (with the right token), and from the first byte
// of any later request until its reply is sent; a busy connection gets
// the message deadline, an idle one (a rank between requests) none.
struct Conn {
  int fd = -1;
  std::string in, out;  // a request not complete yet; a reply not sent yet
  size_t sent = 0;      // bytes of `out` already sent
  bool authed = false;
  Clock::time_point busy_since;
  bool busy() const { return !authed || !in.empty() || !out.empty(); }
};

// Sends what the socket takes now; false when the peer is gone.
bool flush(Conn& c) {
  while (c.sent < c.out.size()) {
    ssize_t w = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (w <= 0) return false;
    c.sent += static_cast<size_t>(w);
  }
  c.out.clear();
  c.sent = 0;
  return true;
}

// One read of what arrived (poll is level-triggered: the rest comes next
// round, so a fast client cannot starve the others), every request it
// completes answered; false when the connection must close.
bool serve_readable(Conn& c, const std::string& token, Data& data) {
  char buf[64 << 10];
  ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
  if (n < 0) return errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK;
  if (n == 0) return false;
  c.in.append(buf, static_cast<size_t>(n));
  for (Request r;;) {
    Parsed p = parse_request(c.in, token, r);
    if (p == Parsed::refused) return false;
    if (p == Parsed::incomplete) break;
    answer(r, data, c.out);
    c.authed = true;
    c.in.erase(0, r.size);
  }
  return flush(c);
}

}  // namespace

std::string tcp_store_request(const std::string& token, char op, const std::string& key, const std::string& value) {
  std::string m;
  m.reserve(13 + token.size() + key.size() + value.size());
  put_field(m, token);
  m += op;
  put_field(m, key);
  put_field(m, value);
  return m;
}

TcpStore::TcpStore(const std::string& host, int port, bool is_server, std::chrono::milliseconds timeout,
                   TcpStoreOptions options)
    : host_(host), port_(port), timeout_(timeout), token_(std::move(options.token)) {
  VQDDP_CHECK(token_.size() <= kStoreMaxToken, "store: the token (VQDDP_STORE_TOKEN) has {} bytes, more than {}",
              token_.size(), kStoreMaxToken);
  try {
    if (is_server) {
      listen(options.bind_addr.empty() ? host : options.bind_addr, options.remote_peers);
      server_ = std::thread([this] { serve(); });
    }
    connect();
  } catch (...) {
    shutdown();
    throw;
  }
}

TcpStore::~TcpStore() { shutdown(); }

void TcpStore::shutdown() {
  if (client_fd_ >= 0) ::close(client_fd_);
  client_fd_ = -1;
  stop_ = true;
  if (server_.joinable()) server_.join();
  for (int fd : listen_fds_) ::close(fd);
  listen_fds_.clear();
}

void TcpStore::listen(const std::string& addr, bool remote_peers) {
  std::string error;
  std::vector<Address> addrs = resolve(addr, port_, error);
  VQDDP_CHECK(!addrs.empty(), "store: cannot resolve '{}', the address to serve the store on: {}", addr, error);
  check_token_needed(addrs, token_, addr);
  if (remote_peers && std::all_of(addrs.begin(), addrs.end(), is_loopback))
    VQDDP_THROW("store: '{}' is a loopback address on this node (for a host name: an /etc/hosts line such as "
                "'127.0.1.1 {}'), which ranks on other nodes cannot reach: set MASTER_ADDR to an address of rank 0's "
                "node that they reach, or VQDDP_STORE_BIND=0.0.0.0",
                addr, addr);
  // Every address the name has on this machine (localhost: ::1 and
  // 127.0.0.1), on one port: the first bind picks it when port_ is 0.
  for (Address& a : addrs) {
    int fd = ::socket(a.sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;  // a family this machine lacks (IPv6 disabled)
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    set_port(a, port_);
    if (::bind(fd, a.get(), a.len) != 0 || ::listen(fd, 128) != 0) {
      int err = errno;
      ::close(fd);
      if (err == EADDRNOTAVAIL) continue;  // an address of the name that is another machine's
      VQDDP_THROW("store: cannot listen on {} port {}: {} (is another run using MASTER_PORT={}?)", addr, port_,
                  std::strerror(err), port_);
    }
    listen_fds_.push_back(fd);
    socklen_t len = a.len;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a.sa), &len);
    port_ = ntohs(a.sa.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&a.sa)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&a.sa)->sin_port);
  }
  VQDDP_CHECK(!listen_fds_.empty(),
              "store: '{}' is not an address of this machine, so rank 0 cannot serve the store on it (MASTER_ADDR must "
              "name rank 0's node)",
              addr);
}

void TcpStore::connect() {
  // Retried until the deadline: rank 0 may start later than us. Each
  // connect() is bounded too (Linux applies SO_SNDTIMEO to it), else an
  // unreachable host would hold it for the kernel's SYN retries.
  auto deadline = Clock::now() + timeout_;
  std::string last_error = "no attempt";
  while (client_fd_ < 0) {
    std::vector<Address> addrs = resolve(host_, port_, last_error);
    check_token_needed(addrs, token_, host_);
    for (const Address& a : addrs) {
      int fd = ::socket(a.sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) continue;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      set_io_timeout(fd, std::max(left, std::chrono::milliseconds(20)));
      if (::connect(fd, a.get(), a.len) == 0) {
        int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        set_io_timeout(fd, timeout_);
        client_fd_ = fd;
        break;
      }
      last_error = std::strerror(errno);
      ::close(fd);
    }
    if (client_fd_ >= 0) break;
    if (Clock::now() > deadline)
      throw TimeoutError(fmt::format("store: cannot connect to {}:{} within {} ms ({}): is rank 0 running, and are "
                                     "MASTER_ADDR and MASTER_PORT right?",
                                     host_, port_, timeout_.count(), last_error));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // A wrong token fails here, at start, rather than at the first set/get.
  bool found = false;
  request('P', "", "", found);
}

void TcpStore::serve() {
  Data data;
  std::vector<Conn> conns;
  std::vector<pollfd> fds;
  const auto message_deadline = std::min(timeout_, kStoreMessageDeadline);
  bool accept_paused = false;  // out of file descriptors: poll the listeners again next round
  while (!stop_) {
    fds.clear();
    for (const Conn& c : conns) fds.push_back({c.fd, static_cast<short>(c.out.empty() ? POLLIN : POLLOUT), 0});
    if (!accept_paused)
      for (int fd : listen_fds_) fds.push_back({fd, POLLIN, 0});
    accept_paused = false;
    if (::poll(fds.data(), fds.size(), 50) < 0) continue;  // EINTR
    auto now = Clock::now();
    for (size_t i = 0; i < conns.size(); ++i) {
      Conn& c = conns[i];
      bool was_busy = c.busy();
      bool keep = true;
      if (fds[i].revents & POLLOUT) keep = flush(c);
      else if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) keep = serve_readable(c, token_, data);
      if (!was_busy && c.busy()) c.busy_since = now;
      if (!keep || (c.busy() && now - c.busy_since > message_deadline)) {
        ::close(c.fd);
        c.fd = -1;
      }
    }
    std::erase_if(conns, [](const Conn& c) { return c.fd < 0; });
    for (size_t i = 0; i < fds.size(); ++i) {
      if (std::find(listen_fds_.begin(), listen_fds_.end(), fds[i].fd) == listen_fds_.end() ||
          !(fds[i].revents & POLLIN))
        continue;
      for (int fd; (fd = ::accept4(fds[i].fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0;) {
        Conn c;
        c.fd = fd;
        c.busy_since = now;
        conns.push_back(std::move(c));
      }
      accept_paused |= errno == EMFILE || errno == ENFILE;
    }
  }
  for (const Conn& c : conns) ::close(c.fd);
}

std::string TcpStore::request(char op, const std::string& key, const std::string& value, bool& found) {
  VQDDP_CHECK(key.size() <= kStoreMaxKey, "store: a key has {} bytes, more than {}", key.size(), kStoreMaxKey);
  VQDDP_CHECK(value.size() <= kStoreMaxValue, "store: the value of '{}' has {} bytes, more than {}", key, value.size(),
              kStoreMaxValue);
  VQDDP_CHECK(client_fd_ >= 0, "store: the connection to {}:{} failed earlier", host_, port_);
  std::string message = tcp_store_request(token_, op, key, value);
  char f = 0, len[4];
  std::string out;
  Io io = send_all(client_fd_, message.data(), message.size());
  if (io == Io::ok) io = recv_all(client_fd_, &f, 1);
  if (io == Io::ok && f && op == 'G') io = recv_all(client_fd_, len, 4);
  if (io == Io::ok && f && op == 'G') {
    out.resize(std::min<size_t>(get_u32(len), kStoreMaxValue));
    io = out.size() == get_u32(len) ? recv_all(client_fd_, out.data(), out.size()) : Io::closed;
  }
  if (io != Io::ok) {
    // The stream may be mid-message: no later request could be read right.
    ::close(client_fd_);
    client_fd_ = -1;
  }
  if (io == Io::timed_out)
    throw TimeoutError(fmt::format("store: no reply from {}:{} within {} ms while {}", host_, port_, timeout_.count(),
                                   doing(op, key)));
  VQDDP_CHECK(io == Io::ok,
              "store: {}:{} closed the connection while {} (did rank 0 exit, or does this process's VQDDP_STORE_TOKEN "
              "differ from rank 0's?)",
              host_, port_, doing(op, key));
  found = f != 0;
  return out;
}

void TcpStore::set(const std::string& key, const std::string& value) {
  bool found = false;
  request('S', key, value, found);
}

std::string TcpStore::get(const std::string& key) {
  auto deadline = Clock::now() + timeout_;
  for (;;) {
    bool found = false;
    std::string v = request('G', key, "", found);
    if (found) return v;
    if (Clock::now() > deadline)
      throw TimeoutError(fmt::format("store {}:{}: key '{}' was not set within {} ms (a rank missing or late?)", host_,
                                     port_, key, timeout_.count()));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

FileStore::FileStore(std::string dir, std::chrono::milliseconds timeout) : dir_(std::move(dir)), timeout_(timeout) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  VQDDP_CHECK(std::filesystem::is_directory(dir_), "file store: '{}' is not a usable directory", dir_);
}

std::string FileStore::path_of(const std::string& key) const {
  std::string safe;
  for (char c : key) safe += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ? c : '.';
  return dir_ + "/" + safe;
}

// No stale-temporary removal: the directory is shared between hosts, where
// another host's live writer's pid can look dead from here.
void FileStore::set(const std::string& key, const std::string& value) {
  write_file_atomic(path_of(key), value, /*remove_stale=*/false);
}

std::string FileStore::get(const std::string& key) {
  auto deadline = Clock::now() + timeout_;
  std::string path = path_of(key);
  while (!std::filesystem::exists(path)) {
    if (Clock::now() > deadline)
      throw TimeoutError(fmt::format("file store {}: key '{}' was not set within {} ms", dir_, key, timeout_.count()));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return read_file(path);
}

}  // namespace vqddp
