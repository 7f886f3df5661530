#include "comm/store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "comm/errors.h"
#include "engine/file_io.h"

namespace vqddp {

namespace {

using Clock = std::chrono::steady_clock;

// Whole-buffer socket I/O; false when the peer closed or an error occurred.
bool send_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool recv_all(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool send_string(int fd, const std::string& s) {
  uint32_t n = static_cast<uint32_t>(s.size());
  return send_all(fd, &n, 4) && send_all(fd, s.data(), s.size());
}

bool recv_string(int fd, std::string& s) {
  uint32_t n = 0;
  if (!recv_all(fd, &n, 4) || n > (64u << 20)) return false;
  s.resize(n);
  return recv_all(fd, s.data(), n);
}

}  // namespace

TcpStore::TcpStore(const std::string& host, int port, bool is_server, std::chrono::milliseconds timeout)
    : host_(host), port_(port), timeout_(timeout) {
  if (is_server) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    VQDDP_CHECK(listen_fd_ >= 0, "store: socket(): {}", std::strerror(errno));
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listen_fd_, 128) != 0) {
      int err = errno;
      ::close(listen_fd_);
      VQDDP_THROW("store: cannot listen on port {}: {} (is another run using MASTER_PORT={}?)", port,
                  std::strerror(err), port);
    }
    socklen_t len = sizeof addr;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    server_ = std::thread([this] { serve(); });
  }
  // Connect, retrying until the deadline: rank 0 may start later than us.
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  auto deadline = Clock::now() + timeout_;
  std::string last_error = "no attempt";
  while (client_fd_ < 0) {
    addrinfo* res = nullptr;
    int rc = ::getaddrinfo(host.c_str(), std::to_string(port_).c_str(), &hints, &res);
    if (rc != 0) {
      last_error = ::gai_strerror(rc);
    } else {
      for (addrinfo* a = res; a && client_fd_ < 0; a = a->ai_next) {
        int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          client_fd_ = fd;
        } else {
          last_error = std::strerror(errno);
          ::close(fd);
        }
      }
      ::freeaddrinfo(res);
    }
    if (client_fd_ >= 0) break;
    if (Clock::now() > deadline) {
      shutdown();
      throw TimeoutError(fmt::format("store: cannot connect to {}:{} within {} ms ({}): is rank 0 running, and are "
                                     "MASTER_ADDR and MASTER_PORT right?",
                                     host, port_, timeout_.count(), last_error));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

TcpStore::~TcpStore() { shutdown(); }

void TcpStore::shutdown() {
  if (client_fd_ >= 0) ::close(client_fd_);
  client_fd_ = -1;
  stop_ = true;
  if (server_.joinable()) server_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

void TcpStore::serve() {
  // One thread, poll(): requests are tiny and few (a rendezvous, not a
  // database). Protocol: op ('S' set, 'G' get), key, value; replies: one
  // found byte, then the value for a get.
  std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
  while (!stop_) {
    if (::poll(fds.data(), fds.size(), 50) <= 0) continue;
    if (fds[0].revents & POLLIN) {
      int c = ::accept(listen_fd_, nullptr, nullptr);
      if (c >= 0) fds.push_back({c, POLLIN, 0});
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char op = 0;
      std::string key, value;
      bool ok = recv_all(fds[i].fd, &op, 1) && recv_string(fds[i].fd, key) && recv_string(fds[i].fd, value);
      if (ok) {
        std::lock_guard lock(data_mu_);
        if (op == 'S') {
          data_[key] = value;
          char found = 1;
          ok = send_all(fds[i].fd, &found, 1);
        } else {
          auto it = data_.find(key);
          char found = it != data_.end();
          ok = send_all(fds[i].fd, &found, 1) && (!found || send_string(fds[i].fd, it->second));
        }
      }
      if (!ok) {
        ::close(fds[i].fd);
        fds.erase(fds.begin() + static_cast<long>(i));
        --i;
      }
    }
  }
  for (size_t i = 1; i < fds.size(); ++i) ::close(fds[i].fd);
}

std::string TcpStore::request(char op, const std::string& key, const std::string& value, bool& found) {
  char f = 0;
  bool ok = send_all(client_fd_, &op, 1) && send_string(client_fd_, key) && send_string(client_fd_, value) &&
            recv_all(client_fd_, &f, 1);
  std::string out;
  if (ok && f && op == 'G') ok = recv_string(client_fd_, out);
  VQDDP_CHECK(ok, "store: connection to {}:{} lost while {} '{}' (did rank 0 exit?)", host_, port_,
              op == 'S' ? "setting" : "reading", key);
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

void FileStore::set(const std::string& key, const std::string& value) { write_file_atomic(path_of(key), value); }

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
