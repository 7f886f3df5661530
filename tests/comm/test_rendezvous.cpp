// Multi-process plumbing that needs no GPU: the environment contract, the
// TCP and file stores, their deadlines, and the launcher.
#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "comm/dist_env.h"
#include "comm/errors.h"
#include "comm/launcher.h"
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
  CHECK_THROWS_WITH_AS(env_of(with("WORLD_SIZE", "eight")), doctest::Contains("WORLD_SIZE=eight is not an integer"), Error);
  CHECK_THROWS_WITH_AS(env_of(with("RANK", "8")), doctest::Contains("RANK=8 is not below WORLD_SIZE=8"), Error);
  CHECK_THROWS_WITH_AS(env_of(with("MASTER_PORT", "70000")), doctest::Contains("MASTER_PORT=70000 is not an integer in"),
                       Error);
  CHECK_THROWS_WITH_AS(env_of(with("LOCAL_RANK", "5")), doctest::Contains("LOCAL_RANK=5 exceeds RANK=3"), Error);
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
