// Multi-process plumbing that needs no GPU: the environment contract, the
// TCP and file stores, their deadlines, the TCP store against broken and
// hostile clients, and the launcher.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "comm/dist_env.h"
#include "comm/errors.h"
#include "comm/process_launcher.h"
#include "comm/rendezvous.h"
#include "comm/slurm_env.h"
#include "comm/store.h"
#include "tests/engine/tmpdir.h"

using namespace vqddp;
using namespace std::chrono_literals;

namespace {
DistEnv env_of(std::map<std::string, std::string> vars) {
  return dist_env_from([vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}
const std::map<std::string, std::string> kGood{
    {"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}};

const std::string kToken = "0123456789abcdef0123456789abcdef";

std::string le32(uint32_t n) {
  std::string s;
  for (int i = 0; i < 4; ++i) s += static_cast<char>(n >> (8 * i) & 0xff);
  return s;
}

// A bare TCP connection to a store, to play a broken or hostile client.
class RawClient {
 public:
  RawClient(int port, const std::string& addr = "127.0.0.1") {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, addr.c_str(), &a.sin_addr);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~RawClient() { ::close(fd_); }
  bool connected() const { return connected_; }
  void send(const std::string& bytes) {
    CHECK(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size()));
  }
  // True when the server closes the connection within `wait`, having sent
  // nothing on it.
  bool closed_within(std::chrono::milliseconds wait) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(wait.count())) != 1) return false;
    char c;
    return ::recv(fd_, &c, 1, 0) <= 0;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

// An IPv4 address of this machine other than loopback, if it has one.
std::optional<std::string> other_local_address() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return std::nullopt;
  std::optional<std::string> found;
  for (ifaddrs* i = list; i && !found; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    in_addr a = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr;
    char text[INET_ADDRSTRLEN];
    if (ntohl(a.s_addr) >> 24 != 127 && ::inet_ntop(AF_INET, &a, text, sizeof text)) found = text;
  }
  ::freeifaddrs(list);
  return found;
}

// Sets (or, with nullptr, unsets) an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~ScopedEnv() { old_ ? ::setenv(name_, old_->c_str(), 1) : ::unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}
}  // namespace

TEST_CASE("the environment contract: torchrun's variables, and an error naming each bad one") {
  DistEnv e = env_of(kGood);
  CHECK(e.rank == 3);
  CHECK(e.world_size == 8);
  CHECK(e.local_rank == 1);
  CHECK(e.master_addr == "node0");
  CHECK(e.master_port == 29500);
  auto without = [](const std::string& k) {
    auto v = kGood;
    v.erase(k);
    return v;
  };
  auto with = [](const std::string& k, const std::string& x) {
    auto v = kGood;
    v[k] = x;
    return v;
  };
  CHECK_THROWS_WITH_AS(env_of(without("RANK")), doctest::Contains("environment variable RANK is not set"), Error);
  CHECK_THROWS_WITH_AS(env_of(without("MASTER_ADDR")), doctest::Contains("MASTER_ADDR is not set"), Error);
  CHECK_THROWS_WITH_AS(env_of(with("WORLD_SIZE", "eight")),
                       doctest::Contains("environment variable WORLD_SIZE must be an integer, got 'eight'"), Error);
  CHECK_THROWS_WITH_AS(env_of(with("RANK", "8")), doctest::Contains("RANK=8 is not below WORLD_SIZE=8"), Error);
  CHECK_THROWS_WITH_AS(env_of(with("MASTER_PORT", "70000")),
                       doctest::Contains("environment variable MASTER_PORT must be in [1, 65535], got 70000"), Error);
  CHECK_THROWS_WITH_AS(env_of(with("LOCAL_RANK", "5")), doctest::Contains("LOCAL_RANK=5 exceeds RANK=3"), Error);
  CHECK(e.store_token.empty());  // optional: torchrun sets none
  CHECK(env_of(with("VQDDP_STORE_TOKEN", "s3cret")).store_token == "s3cret");
}

TEST_CASE("a Slurm job step is a launcher: srun's variables stand for torchrun's, and a variable the user set wins") {
  // Task 4 of `srun -N 3 -n 7` on node n2 (tasks 3 per node, then 1),
  // as srun sets them (comm/slurm_env.h).
  const std::map<std::string, std::string> step{
      {"SLURM_JOB_ID", "123456"}, {"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "7"},
      {"SLURM_STEP_NUM_TASKS", "7"}, {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "1"},
      {"SLURM_STEP_NODELIST", "gpu[07-08,12]"}, {"SLURM_STEP_TASKS_PER_NODE", "3(x2),1"}, {"SLURMD_NODENAME", "gpu08"}};
  auto lookup_in = [](const std::map<std::string, std::string>& vars) {
    return [vars](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  };
  DistEnv e = env_of(step);
  CHECK(e.rank == 4);
  CHECK(e.world_size == 7);
  CHECK(e.local_rank == 1);
  CHECK(e.master_addr == "gpu07");
  CHECK(e.master_port == 15000 + (123456 % 1700) * 10 + 0);
  auto second = step;  // another step of the job, on the same first node
  second["SLURM_STEP_ID"] = "1";
  CHECK(env_of(second).master_port == e.master_port + 1);
  CHECK(dist_env_present(lookup_in(step)));
  EnvLookup full = with_slurm_step(lookup_in(step));
  CHECK(std::string(full("LOCAL_WORLD_SIZE")) == "3");
  CHECK(slurm_node_name(lookup_in(step)) == "node gpu08");
  // The user's own variables win: node names that do not resolve, a port in use.
  auto mine = step;
  mine["MASTER_ADDR"] = "10.0.0.7";
  mine["MASTER_PORT"] = "29500";
  CHECK(env_of(mine).master_addr == "10.0.0.7");
  CHECK(env_of(mine).master_port == 29500);
  // The batch script itself (no SLURM_STEP_ID) is one process, not a rank.
  auto batch = step;
  batch.erase("SLURM_STEP_ID");
  CHECK_FALSE(dist_env_present(lookup_in(batch)));
  CHECK(slurm_node_name(lookup_in(batch)).empty());
  CHECK_THROWS_WITH_AS(env_of(batch), doctest::Contains("environment variable WORLD_SIZE is not set"), Error);
  // A task past its step's size is an error naming the variables it read.
  auto past = step;
  past["SLURM_PROCID"] = "7";
  CHECK_THROWS_WITH_AS(env_of(past), doctest::Contains("RANK=7 is not below WORLD_SIZE=7"), Error);

  CHECK(slurm_first_host("n1") == "n1");
  CHECK(slurm_first_host("n[1-3]") == "n1");
  CHECK(slurm_first_host("login1,gpu[07-09]") == "login1");
  CHECK(slurm_first_host("gpu[012,3]-ib") == "gpu012-ib");
  CHECK(slurm_first_host("rack[2-3]node[05-06]") == "rack2node05");
  CHECK_THROWS_WITH_AS(slurm_first_host("gpu[1-2"), doctest::Contains("Slurm node list 'gpu[1-2' names no node"), Error);
  CHECK_THROWS_WITH_AS(slurm_first_host(""), doctest::Contains("names no node"), Error);
  CHECK_THROWS_WITH_AS(slurm_first_host("n[]"), doctest::Contains("'n[]': a bracket without a first number"), Error);
  CHECK_THROWS_WITH_AS(slurm_first_host("n[-3]"), doctest::Contains("a bracket without a first number"), Error);
  CHECK(slurm_tasks_on_node("3(x2),1", 0) == 3);
  CHECK(slurm_tasks_on_node("3(x2),1", 2) == 1);
  CHECK(slurm_tasks_on_node("3(x2),1", 3) == std::nullopt);
  CHECK(slurm_tasks_on_node("2", 0) == 2);
  CHECK(slurm_tasks_on_node("1(x99999999999),2", 5) == 1);
  CHECK_THROWS_WITH_AS(slurm_tasks_on_node("3(x2,1", 0), doctest::Contains("'3(x2' is not N or N(xK)"), Error);
}

TEST_CASE("TCP store: several clients on 127.0.0.1 exchange values; get waits for a later set") {
  TcpStore server("127.0.0.1", 0, true, 5s);
  int port = server.port();
  std::vector<std::string> got(3);
  std::vector<std::thread> clients;
  for (int r = 0; r < 3; ++r)
    clients.emplace_back([&, r] {
      TcpStore c("127.0.0.1", port, false, 5s);
      got[r] = c.get("id");  // set below, after the clients started
      c.set("ack/" + std::to_string(r), got[r]);
    });
  std::this_thread::sleep_for(50ms);
  server.set("id", std::string("\0binary\xff", 8));
  for (auto& t : clients) t.join();
  for (int r = 0; r < 3; ++r) {
    CHECK(got[r] == std::string("\0binary\xff", 8));
    CHECK(server.get("ack/" + std::to_string(r)) == got[r]);
  }
}

TEST_CASE("TCP store deadlines: a key nobody sets and a server that is not there are errors, not hangs") {
  TcpStore server("127.0.0.1", 0, true, 200ms);
  CHECK_THROWS_WITH_AS(server.get("never"), doctest::Contains("key 'never' was not set within 200 ms"), TimeoutError);
  int port = free_local_port();
  CHECK_THROWS_WITH_AS(TcpStore("127.0.0.1", port, false, 200ms), doctest::Contains("cannot connect to 127.0.0.1"),
                       TimeoutError);
}

TEST_CASE("file store: set is visible to another store on the same directory; get has a deadline") {
  test::TempDir dir;
  FileStore a(dir.file("rdzv"), 1s), b(dir.file("rdzv"), 100ms);
  a.set("nccl/id", "abc");
  CHECK(b.get("nccl/id") == "abc");
  CHECK_THROWS_WITH_AS(b.get("missing"), doctest::Contains("key 'missing' was not set within 100 ms"), TimeoutError);
}

TEST_CASE("launcher: every process gets its rank; a failing rank stops the others and sets the exit code") {
  test::TempDir dir;
  std::string out = dir.file("ranks");
  LaunchSpec spec;
  spec.nproc = 3;
  spec.command = {"/bin/sh", "-c", "echo $RANK/$WORLD_SIZE/$LOCAL_RANK/$MASTER_ADDR >> " + out};
  CHECK(launch_processes(spec) == 0);
  std::ifstream in(out);
  std::set<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.insert(l);
  CHECK(lines == std::set<std::string>{"0/3/0/127.0.0.1", "1/3/1/127.0.0.1", "2/3/2/127.0.0.1"});
  // Rank 1 fails at once; the others would sleep for a minute.
  spec.command = {"/bin/sh", "-c", "if [ $RANK = 1 ]; then exit 7; fi; sleep 60"};
  auto start = std::chrono::steady_clock::now();
  CHECK(launch_processes(spec) == 7);
  CHECK(std::chrono::steady_clock::now() - start < 30s);  // not a hang: the sleepers were stopped
  spec.command = {};
  CHECK_THROWS_WITH_AS(launch_processes(spec), doctest::Contains("no command to run"), Error);
}

TEST_CASE("TCP store: a client stalled mid-message delays no rank and is dropped at the message deadline" *
          doctest::timeout(30)) {
  TcpStore server("127.0.0.1", 0, true, 2s, {.token = kToken});
  std::string message = tcp_store_request(kToken, 'S', "run_id", std::string(64, 'x'));
  RawClient stalled(server.port()), silent(server.port());
  stalled.send(message.substr(0, message.size() - 32));  // token and key sent, half the value
  auto start = std::chrono::steady_clock::now();
  std::vector<std::string> got(3);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r)
    ranks.emplace_back([&, r] {
      try {
        TcpStore c("127.0.0.1", server.port(), false, 2s, {.token = kToken});
        c.set(fmt::format("seen/{}", r), std::to_string(r));
        got[r] = c.get(fmt::format("seen/{}", (r + 1) % 3));
      } catch (const std::exception& e) {
        got[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  CHECK(std::chrono::steady_clock::now() - start < 2s);  // within the deadline, though two clients hold sockets
  CHECK(got == std::vector<std::string>{"1", "2", "0"});
  // The message deadline is the store's 2 s here: both are dropped after it.
  CHECK(stalled.closed_within(5s));
  CHECK(silent.closed_within(5s));
  CHECK_THROWS_AS(server.get("run_id"), TimeoutError);  // the half-sent set never happened
}

TEST_CASE("TCP store: a client without the right token can neither write a key nor stall the store" *
          doctest::timeout(30)) {
  TcpStore server("127.0.0.1", 0, true, 5s, {.token = kToken});
  server.set("run_id", "good");
  std::string near_miss = kToken;
  near_miss.back() = 'e';
  for (const std::string& token : {std::string(), std::string("wrong"), near_miss}) {
    RawClient hostile(server.port());
    hostile.send(tcp_store_request(token, 'S', "run_id", "evil"));
    CHECK(hostile.closed_within(1s));  // refused at once, not at the 5 s message deadline
  }
  RawClient holding(server.port());  // connected, says nothing
  auto start = std::chrono::steady_clock::now();
  TcpStore rank1("127.0.0.1", server.port(), false, 5s, {.token = kToken});
  CHECK(rank1.get("run_id") == "good");
  rank1.set("seen/1", "good");
  CHECK(std::chrono::steady_clock::now() - start < 1s);
  CHECK(server.get("run_id") == "good");
  // Through the class: refused at construction, naming the token.
  CHECK_THROWS_WITH_AS(TcpStore("127.0.0.1", server.port(), false, 5s, {.token = "wrong"}),
                       doctest::Contains("closed the connection while checking its token (did rank 0 exit, or does "
                                         "this process's VQDDP_STORE_TOKEN differ from rank 0's?)"),
                       Error);
}

TEST_CASE("TCP store: an oversized length is refused before its bytes are read, and an unknown operation is refused" *
          doctest::timeout(30)) {
  TcpStore server("127.0.0.1", 0, true, 5s, {.token = kToken});
  server.set("run_id", "good");
  std::string head = tcp_store_request(kToken, 'S', "run_id", "");  // ends with the value's length
  head.resize(head.size() - 4);
  std::string key_head = le32(kToken.size()) + kToken + "S";
  for (const std::string& prefix : {le32(0xfffffff0u),                                   // token length
                                    key_head + le32(kStoreMaxKey + 1),                     // key length
                                    head + le32(kStoreMaxValue + 1), head + le32(60u << 20)}) {  // value length
    RawClient c(server.port());
    c.send(prefix);  // no body follows: a server waiting for it would hold the connection for 5 s
    CHECK(c.closed_within(1s));
  }
  RawClient unknown(server.port());
  unknown.send(tcp_store_request(kToken, 'X', "run_id", "evil"));
  CHECK(unknown.closed_within(1s));
  CHECK(server.get("run_id") == "good");
  // The caps themselves pass; one byte more is refused by the client, naming the size.
  std::string big(kStoreMaxValue, 'v'), long_key(kStoreMaxKey, 'k');
  server.set(long_key, big);
  CHECK(server.get(long_key) == big);
  CHECK_THROWS_WITH_AS(server.set(long_key + "k", "v"),
                       doctest::Contains("store: a key has 4097 bytes, more than 4096"), Error);
  CHECK_THROWS_WITH_AS(server.set("k", big + "v"),
                       doctest::Contains("store: the value of 'k' has 16777217 bytes, more than 16777216"), Error);
}

TEST_CASE("TCP store: serves on the address MASTER_ADDR names, and refuses to go without a token beyond loopback" *
          doctest::timeout(30)) {
  TcpStore loopback("127.0.0.1", 0, true, 1s);
  if (std::optional<std::string> other = other_local_address()) {
    CHECK_FALSE(RawClient(loopback.port(), *other).connected());
    // Asked for every interface (VQDDP_STORE_BIND=0.0.0.0), it is reachable there.
    TcpStore wide("127.0.0.1", 0, true, 1s, {.token = kToken, .bind_addr = "0.0.0.0"});
    CHECK(RawClient(wide.port(), *other).connected());
  } else {
    MESSAGE("no address other than loopback on this machine: reachability not checked");
  }
  auto no_token = [](const char* addr) {
    return doctest::Contains(fmt::format("no token is set and {} is not a loopback address, so anyone who can reach it "
                                         "could write the rendezvous: export the same random VQDDP_STORE_TOKEN on "
                                         "every node",
                                         addr)
                                 .c_str());
  };
  CHECK_THROWS_WITH_AS(TcpStore("0.0.0.0", 0, true, 1s), no_token("0.0.0.0"), Error);
  CHECK_THROWS_WITH_AS(TcpStore("127.0.0.1", 0, true, 1s, {.bind_addr = "0.0.0.0"}),
                       no_token("0.0.0.0"), Error);
  CHECK_THROWS_WITH_AS(TcpStore("198.51.100.7", 29500, false, 1s),
                       no_token("198.51.100.7"), Error);
  CHECK_THROWS_WITH_AS(TcpStore("198.51.100.7", 0, true, 1s, {.token = kToken}),
                       doctest::Contains("store: '198.51.100.7' is not an address of this machine, so rank 0 cannot "
                                         "serve the store on it"),
                       Error);
  // Ranks on other nodes cannot reach a loopback-only store (MASTER_ADDR a host name that /etc/hosts maps to
  // 127.0.1.1): refused at start, through the environment as a launched rank 0 sees it.
  DistEnv env{.rank = 0, .world_size = 4, .local_rank = 0, .master_addr = "127.0.0.1", .master_port = 0,
              .store_token = kToken};
  auto lookup = [](const char* name) -> const char* { return std::string(name) == "LOCAL_WORLD_SIZE" ? "2" : nullptr; };
  CHECK_THROWS_WITH_AS(rendezvous_store(env, lookup, 1s),
                       doctest::Contains("store: '127.0.0.1' is a loopback address on this node (for a host name: an "
                                         "/etc/hosts line such as '127.0.1.1 127.0.0.1'), which ranks on other nodes "
                                         "cannot reach"),
                       Error);
}

TEST_CASE("launcher: a process still running --exit-grace after another exited 0 is stopped, by SIGKILL if it "
          "ignores SIGTERM" * doctest::timeout(60)) {
  LaunchSpec spec;
  spec.nproc = 2;
  spec.exit_grace_s = 0.5;
  spec.command = {"/bin/sh", "-c", "if [ $RANK = 1 ]; then trap '' TERM; sleep 60; fi"};
  auto start = std::chrono::steady_clock::now();
  CHECK(launch_processes(spec) == kLaunchHungExit);
  CHECK(std::chrono::steady_clock::now() - start < 20s);  // grace, then 5 s for SIGTERM, then SIGKILL
}

TEST_CASE("launcher: a run's processes share one random store token; the launcher's own is passed on, and several "
          "nodes need one" * doctest::timeout(60)) {
  test::TempDir dir;
  LaunchSpec spec;
  spec.nproc = 2;
  spec.command = {"/bin/sh", "-c", "echo $VQDDP_STORE_TOKEN >> " + dir.file("tokens")};
  {
    ScopedEnv unset("VQDDP_STORE_TOKEN", nullptr);
    CHECK(launch_processes(spec) == 0);
    CHECK(launch_processes(spec) == 0);
    std::vector<std::string> t = lines_of(dir.file("tokens"));
    REQUIRE(t.size() == 4);
    CHECK(t[0] == t[1]);
    CHECK(t[2] == t[3]);
    CHECK(t[0] != t[2]);
    CHECK(t[0].size() == 32);
    CHECK(t[0].find_first_not_of("0123456789abcdef") == std::string::npos);
    LaunchSpec nodes = spec;
    nodes.nnodes = 2;
    nodes.master_port = 29500;
    CHECK_THROWS_WITH_AS(launch_processes(nodes),
                         doctest::Contains("launch: with --nnodes 2 export the same VQDDP_STORE_TOKEN on every node"),
                         Error);
  }
  ScopedEnv shared("VQDDP_STORE_TOKEN", "shared-by-every-node");
  std::filesystem::remove(dir.file("tokens"));
  CHECK(launch_processes(spec) == 0);
  CHECK(lines_of(dir.file("tokens")) == std::vector<std::string>{"shared-by-every-node", "shared-by-every-node"});
}

TEST_CASE("launcher: a flag out of range is refused naming the flag, before any process starts") {
  auto with = [](auto change) {
    LaunchSpec spec;
    spec.command = {"/bin/false"};  // would make the launch return 1 if started
    change(spec);
    return spec;
  };
  CHECK_THROWS_WITH_AS(launch_processes(with([](LaunchSpec& s) { s.master_port = -5; })),
                       doctest::Contains("launch: --master-port must be in [0, 65535], got -5"), Error);
  CHECK_THROWS_WITH_AS(launch_processes(with([](LaunchSpec& s) { s.master_port = 65536; })),
                       doctest::Contains("launch: --master-port must be in [0, 65535], got 65536"), Error);
  CHECK_THROWS_WITH_AS(launch_processes(with([](LaunchSpec& s) { s.nproc = 0; })),
                       doctest::Contains("launch: --nproc must be in [1, 4096], got 0"), Error);
  CHECK_THROWS_WITH_AS(launch_processes(with([](LaunchSpec& s) { s.nproc = 4097; })),
                       doctest::Contains("launch: --nproc must be in [1, 4096], got 4097"), Error);
  CHECK_THROWS_WITH_AS(launch_processes(with([](LaunchSpec& s) { s.nnodes = 0; })),
                       doctest::Contains("launch: --nnodes must be in [1, 1048576], got 0"), Error);
  CHECK_THROWS_WITH_AS(launch_processes(with([](LaunchSpec& s) { s.nproc = 8, s.nnodes = 131073; })),
                       doctest::Contains("launch: --nnodes must be in [1, 131072], got 131073"), Error);
  CHECK_THROWS_WITH_AS(launch_processes(with([](LaunchSpec& s) { s.nnodes = 2, s.node_rank = 2; })),
                       doctest::Contains("launch: --node-rank must be in [0, 1], got 2"), Error);
  CHECK_THROWS_WITH_AS(launch_processes(with([](LaunchSpec& s) { s.node_rank = -1; })),
                       doctest::Contains("launch: --node-rank must be in [0, 0], got -1"), Error);
  CHECK_THROWS_WITH_AS(launch_processes(with([](LaunchSpec& s) { s.exit_grace_s = -1; })),
                       doctest::Contains("launch: --exit-grace must be a number of seconds >= 0 (0: no limit), got -1"),
                       Error);
}
