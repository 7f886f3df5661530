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
#include <cstddef>
#include <string>
#include <thread>
#include <vector>

namespace vqddp {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits until `key` is set; throws TimeoutError after the store's deadline.
  virtual std::string get(const std::string& key) = 0;
};

// Size caps of one TCP store request, checked on a length prefix before
// anything is allocated for what follows it. A rendezvous moves small
// blobs (NCCL's unique id is 128 bytes); 16 MiB leaves room for a config or
// a small table without letting one request pin much memory.
inline constexpr size_t kStoreMaxToken = 256;
inline constexpr size_t kStoreMaxKey = 4 << 10;
inline constexpr size_t kStoreMaxValue = 16 << 20;
// Longest a busy connection may take to finish a message (a request, or
// reading a reply), capped further by the store's own timeout.
inline constexpr std::chrono::milliseconds kStoreMessageDeadline{10000};

struct TcpStoreOptions {
  // Every request carries it; the server drops a connection whose request
  // has another one (constant-time compare). `vqddp launch` makes a random
  // one per run and passes it as VQDDP_STORE_TOKEN. Empty is allowed only
  // on loopback: a store that would listen on (or a client that would
  // connect to) any other address without a token is refused at
  // construction, so a multi-node run started by torchrun or srun must
  // export the same VQDDP_STORE_TOKEN on every node.
  std::string token = {};
  // Server only: the address to listen on instead of the one `host` names,
  // e.g. "0.0.0.0" for every interface (VQDDP_STORE_BIND, see
  // rendezvous.h) when MASTER_ADDR is a name other nodes resolve but this
  // node cannot bind.
  std::string bind_addr = {};
  // Server only: ranks on other nodes must reach it. A name that resolves
  // to loopback alone on rank 0's node (Debian's /etc/hosts maps the host's
  // own name to 127.0.1.1) would then leave them timing out: refused at
  // start instead, with what to set. (rendezvous_store sets it when
  // LOCAL_WORLD_SIZE < WORLD_SIZE.)
  bool remote_peers = false;
  // (`= {}` on the strings: designated initializers may name just one
  // without -Wmissing-field-initializers.)
};

// A small TCP store. The process with is_server (rank 0) also runs the
// server, on `port` of the address `host` resolves to (127.0.0.1: loopback
// only; 0.0.0.0: every interface; port 0: any free port, see port());
// every process, the server's included, talks to it as a client, retrying
// the connection until the deadline, then checking its token with a first
// request.
//
// The server is one poll() thread: a client that stalls mid-message delays
// no one else and is dropped after kStoreMessageDeadline (or the timeout,
// when shorter), as is a connection that sends no complete request that
// soon after connecting. Oversized lengths, a wrong token and an unknown
// operation close the connection without a reply or a log line.
class TcpStore : public Store {
 public:
  TcpStore(const std::string& host, int port, bool is_server, std::chrono::milliseconds timeout,
           TcpStoreOptions options = {});
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int port() const { return port_; }

 private:
  void listen(const std::string& addr, bool remote_peers);
  void connect();
  void serve();
  void shutdown();  // closes the sockets and joins the server thread
  // One request and its reply; `found` is false for a get of a missing key.
  std::string request(char op, const std::string& key, const std::string& value, bool& found);

  std::string host_;
  int port_;
  std::chrono::milliseconds timeout_;
  std::string token_;
  int client_fd_ = -1;
  std::vector<int> listen_fds_;
  std::thread server_;
  std::atomic<bool> stop_{false};
};

// The bytes of one TCP store request, little-endian lengths:
//   u32 n, token[n], op, u32 n, key[n], u32 n, value[n]
// with op 'S' (set), 'G' (get) or 'P' (ping: checks the token). The reply
// is one byte (1: done / found, 0: not found), then for a found get u32 n,
// value[n]. Exposed for tests that play a broken or hostile client.
std::string tcp_store_request(const std::string& token, char op, const std::string& key, const std::string& value);

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
