// The NCCL backend's failure handling without a GPU: the watchdog's timing
// and abort logic with fake completion, error state and abort; the
// fingerprint words the NCCL ranks compare; the rendezvous that hands out
// the NCCL id; the backend's errors on a machine without a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <thread>

#include "comm/fingerprint.h"
#include "comm/backends.h"
#include "comm/process_launcher.h"
#include "comm/nccl_communicator.h"
#include "comm/rendezvous.h"
#include "comm/watchdog.h"
#include "engine/device.h"
#include "tests/engine/tmpdir.h"

using namespace vqddp;
using namespace std::chrono_literals;

namespace {

// Abort calls and the error state the fake backend reports.
struct FakeBackend {
  std::atomic<int> aborts{0};
  std::atomic<bool> broken{false};
  std::atomic<bool> initialised_elsewhere{false};
  Watchdog::Hooks hooks() {
    auto caller = std::this_thread::get_id();
    return {[this] { return broken ? std::string("peer 3 vanished") : std::string(); }, [this] { ++aborts; },
            [this, caller] { initialised_elsewhere = std::this_thread::get_id() != caller; }};
  }
};

}  // namespace

TEST_CASE("watchdog: a collective that completes in time is let go, nothing is aborted") {
  FakeBackend backend;
  Watchdog dog(backend.hooks(), 1ms);
  std::atomic<bool> finished{false};
  std::atomic<int> retired{0};
  dog.watch(0, "all_reduce(sum) float32 x4", 5s, [&] { return finished.load(); }, [&] { ++retired; });
  std::this_thread::sleep_for(20ms);
  CHECK(retired == 0);  // still watched: not done yet
  finished = true;
  dog.wait_until([&] { return retired.load() == 1; });
  CHECK_NOTHROW(dog.check());
  CHECK_FALSE(dog.failed());
  CHECK(backend.aborts == 0);
  CHECK(backend.initialised_elsewhere);  // thread_init ran on the watchdog's own thread
}

TEST_CASE("watchdog: a collective past its deadline aborts the communicator once and names collective, seq, deadline") {
  FakeBackend backend;
  Watchdog dog(backend.hooks(), 1ms);
  std::atomic<int> retired{0};
  dog.watch(6, "broadcast float32 x8 root=0", 10s, [] { return true; }, [&] { ++retired; });
  dog.watch(7, "all_reduce(sum) float32 x4", 50ms, [] { return false; }, [&] { ++retired; });
  auto start = std::chrono::steady_clock::now();
  // A caller waiting for the stuck collective is woken by the failure.
  CHECK_THROWS_WITH_AS(dog.wait_until([] { return false; }),
                       doctest::Contains("all_reduce(sum) float32 x4 #7 did not complete within its deadline of 50 ms"),
                       TimeoutError);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  CHECK(backend.aborts == 1);
  // Every later call raises the same failure; both entries are let go.
  CHECK_THROWS_AS(dog.check(), TimeoutError);
  dog.stop();
  CHECK(retired == 2);
  CHECK(backend.aborts == 1);
}

TEST_CASE("watchdog: an asynchronous error aborts at once, naming the error and the collective in flight") {
  FakeBackend backend;
  Watchdog dog(backend.hooks(), 1ms);
  dog.watch(3, "all_gather int64 x1", 1h, [] { return false; });
  backend.broken = true;
  CHECK_THROWS_WITH_AS(dog.wait_until([] { return false; }), doctest::Contains("peer 3 vanished"), AbortedError);
  CHECK_THROWS_WITH_AS(dog.check(), doctest::Contains("in flight: all_gather int64 x1 #3"), AbortedError);
  CHECK(backend.aborts == 1);
}

TEST_CASE("watchdog: the first failure stays; record() does not abort, fail() does") {
  FakeBackend backend;
  Watchdog dog(backend.hooks(), 1ms);
  dog.record(CommFailure::desync, "collective #2: ranks called different collectives");
  CHECK(backend.aborts == 0);
  dog.fail(CommFailure::timeout, "later");
  CHECK(backend.aborts == 0);  // not the first failure: nothing more to do
  CHECK_THROWS_WITH_AS(dog.check(), doctest::Contains("#2: ranks called different"), DesyncError);
  Watchdog other(backend.hooks(), 1ms);
  other.fail(CommFailure::aborted, "rank 1 failed");
  CHECK(backend.aborts == 1);
  CHECK_THROWS_AS(other.check(), AbortedError);
}

TEST_CASE("fingerprint words: equal calls encode equal, any difference shows, and describe() reads them back") {
  Fingerprint sum("all_reduce(sum)", DType::f32, 1000);
  CHECK(encode_fingerprint(sum, 12) == encode_fingerprint(Fingerprint("all_reduce(sum)", DType::f32, 1000), 12));
  CHECK(describe_fingerprint(encode_fingerprint(sum, 12)) == "#12 all_reduce(sum) float32 x1000");
  for (const Fingerprint& other :
       {Fingerprint("all_reduce(avg)", DType::f32, 1000), Fingerprint("all_reduce(sum)", DType::f64, 1000),
        Fingerprint("all_reduce(sum)", DType::f32, 999), Fingerprint("broadcast", DType::f32, 1000, 0)})
    CHECK(encode_fingerprint(other, 12) != encode_fingerprint(sum, 12));
  CHECK(encode_fingerprint(sum, 13) != encode_fingerprint(sum, 12));  // a rank one call ahead
  Fingerprint rows("all_gather_rows", DType::i64, 3, -1, {2, 0, 5});
  CHECK(encode_fingerprint(rows, 1) != encode_fingerprint(Fingerprint("all_gather_rows", DType::i64, 3, -1, {2, 5, 0}), 1));
  CHECK(describe_fingerprint(encode_fingerprint(rows, 1)).starts_with("#1 all_gather_rows int64 x3 rows-hash="));
  CHECK(describe_fingerprint(encode_fingerprint(Fingerprint("broadcast", DType::f64, 4, 2), 0)) ==
        "#0 broadcast float64 x4 root=2");
  CHECK(describe_fingerprint(encode_fingerprint(Fingerprint("barrier", DType::f32, 0), 9)) == "#9 barrier");
  CHECK(describe_fingerprint({99, 7, 1, -1, 0, 4}) == "#4 unknown collective 99 dtype7 x1");
  CHECK(desync_message(4, {"a", "b"}) == "collective #4: ranks called different collectives:\n  rank 0: a\n  rank 1: b");
}

TEST_CASE("rendezvous: rank 0's blob reaches every rank; a rank launched with another WORLD_SIZE fails at once") {
  TcpStore server("127.0.0.1", 0, true, 5s);
  DistEnv env{.rank = 0, .world_size = 3, .local_rank = 0, .master_addr = "127.0.0.1", .master_port = server.port()};
  std::string id("\0nccl-id\xff", 9);
  int made = 0;
  CHECK(share_from_rank0(server, env, "nccl_unique_id", [&] { return ++made, id; }) == id);
  for (int r = 1; r < 3; ++r) {
    DistEnv mine = env;
    mine.rank = r;
    TcpStore client("127.0.0.1", server.port(), false, 5s);
    CHECK(share_from_rank0(client, mine, "nccl_unique_id", [&] { return ++made, std::string("wrong"); }) == id);
  }
  CHECK(made == 1);  // only rank 0 makes the id
  DistEnv odd = env;
  odd.rank = 1;
  odd.world_size = 4;
  TcpStore client("127.0.0.1", server.port(), false, 5s);
  CHECK_THROWS_WITH_AS(share_from_rank0(client, odd, "nccl_unique_id", [] { return std::string(); }),
                       doctest::Contains("rank 1 has WORLD_SIZE=4 but rank 0 has WORLD_SIZE=3"), Error);
  // A rank 0 that never publishes: a deadline error, not a hang.
  TcpStore quick("127.0.0.1", server.port(), false, 100ms);
  DistEnv other_port = odd;
  other_port.world_size = 3;
  other_port.master_port = 1;  // a different run's keys
  CHECK_THROWS_AS(share_from_rank0(quick, other_port, "nccl_unique_id", [] { return std::string(); }), TimeoutError);
}

TEST_CASE("rendezvous store: VQDDP_STORE_DIR picks the file store, else TCP on MASTER_ADDR:MASTER_PORT") {
  test::TempDir dir;
  std::map<std::string, std::string> vars{{"VQDDP_STORE_DIR", dir.file("rdzv")}};
  auto lookup = [&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
  DistEnv env{.rank = 0, .world_size = 2, .local_rank = 0, .master_addr = "127.0.0.1", .master_port = free_local_port()};
  auto a = rendezvous_store(env, lookup, 1s);
  CHECK(dynamic_cast<FileStore*>(a.get()) != nullptr);
  a->set("k", "v");
  CHECK(FileStore(dir.file("rdzv"), 100ms).get("k") == "v");
  vars.clear();
  auto b = rendezvous_store(env, lookup, 1s);  // rank 0 serves on the port
  CHECK(dynamic_cast<TcpStore*>(b.get()) != nullptr);
  CHECK(dist_env_present(lookup) == false);
  vars["MASTER_PORT"] = "29500";
  CHECK(dist_env_present(lookup) == true);
}

TEST_CASE("backend nccl without a usable GPU or without NCCL: a clear error before any collective") {
  if (nccl_built() && cuda_device_count() > 0) return;  // the GPU suite covers this machine
  LaunchOptions o{.backend = "nccl"};
  std::vector<std::string> names = backend_names();
  CHECK(std::find(names.begin(), names.end(), "nccl") != names.end());
  bool ran = false;
  std::string expected = nccl_built() ? "nccl rank 0: LOCAL_RANK=0 needs cuda:0, but this machine has 0 CUDA device(s)"
                                      : "backend 'nccl' is not in this build";
  ::unsetenv("RANK");  // a world of one: no rendezvous needed to reach the GPU check
  CHECK_THROWS_WITH_AS(launch_ranks(o, [&](Communicator&) { ran = true; }), doctest::Contains(expected.c_str()), Error);
  CHECK_FALSE(ran);
}
