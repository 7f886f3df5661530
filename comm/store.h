// Key-value stores for the rendezvous of a multi-process run: rank 0
// publishes what the others need before any collective exists (NCCL's
// ncclUniqueId, a run id), the others wait for it.
//
// Every wait has a deadline: a rank that never shows up, a wrong
// MASTER_ADDR/MASTER_PORT or a dead rank 0 become a TimeoutError naming the
// key and the address, never a hang.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace vqddp {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits until `key` is set; throws TimeoutError after the store's deadline.
  virtual std::string get(const std::string& key) = 0;
};

// A small TCP store. The process with is_server (rank 0) also runs the
// server, on `port` of every local interface (port 0: any free port, see
// port()); every process, the server's included, talks to it as a client,
// retrying the connection until the deadline.
class TcpStore : public Store {
 public:
  TcpStore(const std::string& host, int port, bool is_server, std::chrono::milliseconds timeout);
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int port() const { return port_; }

 private:
  void serve();
  void shutdown();  // closes the sockets and joins the server thread
  std::string request(char op, const std::string& key, const std::string& value, bool& found);

  std::string host_;
  int port_;
  std::chrono::milliseconds timeout_;
  int client_fd_ = -1;
  int listen_fd_ = -1;
  std::thread server_;
  std::atomic<bool> stop_{false};
  std::mutex data_mu_;
  std::map<std::string, std::string> data_;
};

// A store in a directory of a shared file system: set writes a file
// atomically, get polls for it. For clusters where rank 0's port is not
// reachable but a shared file system is.
class FileStore : public Store {
 public:
  FileStore(std::string dir, std::chrono::milliseconds timeout);
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;

 private:
  std::string path_of(const std::string& key) const;
  std::string dir_;
  std::chrono::milliseconds timeout_;
};

}  // namespace vqddp
