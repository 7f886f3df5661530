// Every failure mode ends in an error on every rank, never in a hang.
// Each rank records the error it saw, so the tests check all of them, not
// only the one run_ranks rethrows.
#include <doctest/doctest.h>

#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "comm/agree.h"
#include "comm/thread_group.h"
#include "engine/ops.h"
#include "engine/step_graph.h"

using namespace vqddp;
using namespace std::chrono_literals;

namespace {

constexpr ThreadGroupOptions kShort{.timeout = 300ms};

// Runs fn on W ranks; returns what each rank threw ("" if it returned).
struct Outcome {
  std::vector<std::string> what;
  std::vector<std::string> type;
  std::vector<int> agreed;     // raised_by_every_rank: each rank raised it itself, alike
  std::vector<int> nonfinite;  // a NonFiniteError
};

template <class Fn>
Outcome run_and_record(int w, Fn fn, ThreadGroupOptions opt = kShort) {
  Outcome o{std::vector<std::string>(w), std::vector<std::string>(w), std::vector<int>(w), std::vector<int>(w)};
  auto record = [&](int r, const char* type, const std::exception& e) {
    o.what[r] = e.what();
    o.type[r] = type;
    o.agreed[r] = raised_by_every_rank(e);
    o.nonfinite[r] = dynamic_cast<const NonFiniteError*>(&e) != nullptr;
  };
  try {
    run_ranks(w, [&](Communicator& comm) {
      try {
        fn(comm);
      } catch (const DesyncError& e) {
        record(comm.rank(), "desync", e);
        throw;
      } catch (const TimeoutError& e) {
        record(comm.rank(), "timeout", e);
        throw;
      } catch (const AbortedError& e) {
        record(comm.rank(), "aborted", e);
        throw;
      } catch (const std::exception& e) {
        record(comm.rank(), "other", e);
        throw;
      }
    }, opt);
  } catch (const std::exception&) {
    // Expected: the per-rank records are what the tests inspect.
  }
  return o;
}

}  // namespace

TEST_CASE("different reduce ops at the same collective: DesyncError on every rank naming each fingerprint") {
  Outcome o = run_and_record(3, [](Communicator& comm) {
    Tensor t = zeros({8});
    comm.barrier();
    comm.all_reduce(t, comm.rank() == 1 ? ReduceOp::max : ReduceOp::sum);
  });
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(o.type[r] == "desync");
    CHECK(o.what[r].find("collective #1") != std::string::npos);
    CHECK(o.what[r].find("rank 0: all_reduce(sum) float32 x8") != std::string::npos);
    CHECK(o.what[r].find("rank 1: all_reduce(max) float32 x8") != std::string::npos);
  }
}

TEST_CASE("different sizes, roots, dtypes or row counts: DesyncError on every rank") {
  SUBCASE("size") {
    Outcome o = run_and_record(4, [](Communicator& comm) {
      Tensor t = zeros({comm.rank() == 3 ? 9 : 8});
      comm.all_reduce(t, ReduceOp::sum);
    });
    for (int r = 0; r < 4; ++r) CHECK(o.type[r] == "desync");
    CHECK(o.what[0].find("rank 3: all_reduce(sum) float32 x9") != std::string::npos);
  }
  SUBCASE("root") {
    Outcome o = run_and_record(2, [](Communicator& comm) {
      Tensor t = zeros({4});
      comm.broadcast(t, comm.rank());
    });
    for (int r = 0; r < 2; ++r) CHECK(o.type[r] == "desync");
    CHECK(o.what[1].find("root=1") != std::string::npos);
  }
  SUBCASE("dtype") {
    Outcome o = run_and_record(2, [](Communicator& comm) {
      Tensor t = zeros({4}, comm.rank() == 0 ? DType::f32 : DType::i64);
      comm.all_reduce(t, ReduceOp::sum);
    });
    for (int r = 0; r < 2; ++r) CHECK(o.type[r] == "desync");
  }
  SUBCASE("row counts of all_gather_rows") {
    Outcome o = run_and_record(2, [](Communicator& comm) {
      std::vector<int64_t> counts = comm.rank() == 0 ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{1, 3};
      Tensor in = zeros({counts[comm.rank()], 2});
      all_gather_rows(comm, in, counts);
    });
    for (int r = 0; r < 2; ++r) CHECK(o.type[r] == "desync");
    CHECK(o.what[0].find("rows=[1,3]") != std::string::npos);
  }
  SUBCASE("different kinds of collective") {
    Outcome o = run_and_record(3, [](Communicator& comm) {
      Tensor t = zeros({4});
      if (comm.rank() == 2)
        comm.broadcast(t, 0);
      else
        comm.all_reduce(t, ReduceOp::sum);
    });
    for (int r = 0; r < 3; ++r) CHECK(o.type[r] == "desync");
  }
}

TEST_CASE("graphed steps on sim: a rank whose collective changes its root, op or row counts after the capture fails, "
          "and so does every other rank, by the deadline") {
  // comm/thread_group.cpp: in a graphed step a thread-rank collective is a
  // launch of the step, checked against the capture. A rank that changes an
  // argument the others keep must not replay the captured one (a silent
  // desync); it fails, and the ranks waiting in their replays fail with it.
  for (std::string change : {"root", "op", "counts"}) {
    CAPTURE(change);
    Outcome o = run_and_record(3, [&](Communicator& comm) {
      const Device sim = Device::sim();
      StepGraph graph(sim);
      for (int step = 1; step <= 4; ++step) {
        graph.begin_step(step);
        const bool odd = step == 3 && comm.rank() == 1;  // the bug: one rank, one step
        Tensor b = ones({4}, DType::f32, sim), s = ones({4}, DType::f32, sim);
        comm.broadcast(b, odd && change == "root" ? 2 : 0);
        comm.all_reduce(s, odd && change == "op" ? ReduceOp::max : ReduceOp::sum);
        std::vector<int64_t> counts{1, 2, 1};
        if (odd && change == "counts") counts = {2, 2, 0};  // its own rows and the total kept
        Tensor rows = empty({4, 2}, DType::f32, sim);
        comm.all_gather_rows(ones({counts[static_cast<size_t>(comm.rank())], 2}, DType::f32, sim), counts, rows);
        graph.end_step();
      }
    });
    for (int r = 0; r < 3; ++r) {
      CAPTURE(r);
      CAPTURE(o.what[r]);
      CHECK(o.what[r].find(r == 1 ? "step graph (sim:0): launch" : "rank 1 failed: step graph (sim:0): launch") == 0);
      CHECK(o.what[r].find(" of step 3 is thread ") != std::string::npos);
      CHECK(o.what[r].find(" with other arguments") != std::string::npos);
    }
  }
}

TEST_CASE("graphed steps on sim: a replay recalls the capture's row counts without a collective; a rank whose rows "
          "change fails, and every rank with it; a host collective in a graphed step is refused") {
  // engine/step_graph.h, host collectives: NCCL would stage a host
  // collective through the GPU, which a graph cannot hold, so no backend
  // runs one in a graphed step.
  SUBCASE("replays recall the counts") {
    std::vector<std::vector<int64_t>> seen(3);
    std::vector<uint64_t> replay_collectives(3);
    Outcome o = run_and_record(3, [&](Communicator& comm) {
      StepGraph graph(Device::sim());
      for (int step = 1; step <= 4; ++step) {
        graph.begin_step(step);
        const uint64_t before = comm.counters().collectives;
        std::vector<int64_t> counts = all_gather_counts(comm, comm.rank() + 1);
        if (step == 4) replay_collectives[comm.rank()] = comm.counters().collectives - before;
        seen[comm.rank()] = counts;
        Tensor s = ones({2}, DType::f32, Device::sim());
        comm.all_reduce(s, ReduceOp::sum);
        graph.end_step();
      }
      CHECK(graph.replays() == 3);
    });
    for (int r = 0; r < 3; ++r) {
      CAPTURE(o.what[r]);
      CHECK(o.what[r].empty());
      CHECK(seen[r] == std::vector<int64_t>{1, 2, 3});
      CHECK(replay_collectives[r] == 0);  // recalled: no all_gather
    }
  }
  SUBCASE("after an issued step, captures recall too: the issued step's counts, and a choice's first run's") {
    // The trainer's flow (train/rank_step.cpp): step 1 issued under the
    // graph, step 2 captured; a choice (as a GAN step's kind) is issued the
    // first time it is made (step 2: x=0; step 3: x=1) and captured the
    // second (step 4: x=0; step 5: x=1).
    std::vector<std::vector<uint64_t>> gathers(3, std::vector<uint64_t>(8));
    Outcome o = run_and_record(3, [&](Communicator& comm) {
      StepGraph graph(Device::sim());
      for (int step = 1; step <= 7; ++step) {
        if (step == 1) graph.begin_issued_step(step);
        else graph.begin_step(step);
        uint64_t before = comm.counters().collectives, n = 0;
        CHECK(all_gather_counts(comm, comm.rank() + 1) == std::vector<int64_t>{1, 2, 3});
        n += comm.counters().collectives - before;
        Tensor s = ones({2}, DType::f32, Device::sim());
        comm.all_reduce(s, ReduceOp::sum);
        note_step_variant("x", step % 2);
        before = comm.counters().collectives;
        CHECK(all_gather_counts(comm, 2 * comm.rank()) == std::vector<int64_t>{0, 2, 4});
        n += comm.counters().collectives - before;
        comm.all_reduce(s, ReduceOp::sum);
        gathers[comm.rank()][step] = n;
        graph.end_step();
      }
      CHECK(graph.replays() == 2);  // steps 6 and 7 (4 and 5 capture a choice each)
    });
    for (int r = 0; r < 3; ++r) {
      CAPTURE(r);
      CAPTURE(o.what[r]);
      CHECK(o.what[r].empty());
      // Step 1 issued (2 gathers); steps 2 and 3: the first segment
      // recalled, the new choice issued (1); then no gather at all.
      CHECK(gathers[r] == std::vector<uint64_t>{0, 2, 1, 1, 0, 0, 0, 0});
    }
  }
  SUBCASE("an abandoned issued step's half-recorded counts are not recalled") {
    Outcome o = run_and_record(2, [&](Communicator& comm) {
      StepGraph graph(Device::sim());
      graph.begin_issued_step(1);
      all_gather_counts(comm, 1);
      graph.abandon_step();  // as if its host code threw before its second gather
      for (int step = 2; step <= 3; ++step) {
        graph.begin_step(step);
        CHECK(all_gather_counts(comm, 1) == std::vector<int64_t>{1, 1});
        CHECK(all_gather_counts(comm, 2) == std::vector<int64_t>{2, 2});
        graph.end_step();
      }
      CHECK(graph.replays() == 1);
    });
    for (int r = 0; r < 2; ++r) CHECK(o.what[r].empty());
  }
  SUBCASE("a rank whose rows change: after the capture, or between the issued step and the capture") {
    // Rank 2's count at step 3 differs from the capture's (step 2); or, with
    // step 1 issued, rank 2's at the capture (step 2) from step 1's.
    for (bool issued : {false, true}) {
      CAPTURE(issued);
      const int odd_step = issued ? 2 : 3;
      Outcome o = run_and_record(3, [&](Communicator& comm) {
        StepGraph graph(Device::sim());
        for (int step = 1; step <= 4; ++step) {
          if (issued && step == 1) graph.begin_issued_step(step);
          else graph.begin_step(step);
          all_gather_counts(comm, step == odd_step && comm.rank() == 2 ? 7 : 2);
          Tensor s = ones({2}, DType::f32, Device::sim());
          comm.all_reduce(s, ReduceOp::sum);
          graph.end_step();
        }
      });
      const std::string failure = fmt::format("step graph (sim:0): step {}, row counts 1", odd_step);
      for (int r = 0; r < 3; ++r) {
        CAPTURE(r);
        CAPTURE(o.what[r]);
        CHECK(o.what[r].find(r == 2 ? fmt::format("{}: this rank has 7 rows, {} 2", failure,
                                                  issued ? "its issued run" : "the captured step")
                                    : "rank 2 failed: " + failure) != std::string::npos);
      }
    }
  }
  SUBCASE("a host collective") {
    Outcome o = run_and_record(2, [&](Communicator& comm) {
      StepGraph graph(Device::sim());
      graph.begin_step(1);
      Tensor flag = ones({1});
      comm.all_reduce(flag, ReduceOp::max);
      graph.end_step();
    });
    for (int r = 0; r < 2; ++r) {
      CAPTURE(o.what[r]);
      CHECK(o.what[r].find("step graph (sim:0): step 1 runs all_reduce of host tensors inside the step") !=
            std::string::npos);
    }
  }
}

TEST_CASE("a rank that skips a collective and returns: the waiting ranks fail at once, naming it") {
  Outcome o = run_and_record(4, [](Communicator& comm) {
    Tensor t = ones({4});
    comm.all_reduce(t, ReduceOp::sum);
    if (comm.rank() == 2) return;  // the bug: skips the second all_reduce
    comm.all_reduce(t, ReduceOp::sum);
  }, {.timeout = 60s});  // a long deadline: the error must not wait for it
  for (int r : {0, 1, 3}) {
    CAPTURE(r);
    CHECK(o.type[r] == "desync");
    CHECK(o.what[r].find("rank 2 returned without calling all_reduce(sum) float32 x4 #1") != std::string::npos);
  }
  CHECK(o.type[2].empty());
}

TEST_CASE("a rank that never arrives: TimeoutError on the others naming the collective and the missing rank") {
  Outcome o = run_and_record(3, [](Communicator& comm) {
    Tensor t = ones({4});
    if (comm.rank() == 1) std::this_thread::sleep_for(1s);  // past the 300 ms deadline
    comm.all_reduce(t, ReduceOp::sum);
  });
  for (int r : {0, 2}) {
    CAPTURE(r);
    CHECK(o.type[r] == "timeout");
    CHECK(o.what[r].find("timeout after 300 ms in all_reduce(sum) float32 x4 #0 (arrival): ranks 1 did not arrive") !=
          std::string::npos);
  }
  // The late rank's call throws at once: the group is already failed.
  CHECK(o.type[1] == "timeout");
}

TEST_CASE("a rank that throws mid-run aborts the group; run_ranks rethrows that first exception") {
  std::vector<std::string> seen(4);
  std::mutex mu;
  auto body = [&](Communicator& comm) {
    Tensor t = ones({4});
    comm.all_reduce(t, ReduceOp::sum);
    try {
      if (comm.rank() == 3) throw std::runtime_error("boom on rank 3");
      comm.all_reduce(t, ReduceOp::sum);
    } catch (const AbortedError& e) {
      std::lock_guard lock(mu);
      seen[comm.rank()] = e.what();
      // Later calls on an aborted group throw at once.
      CHECK_THROWS_AS(comm.barrier(), AbortedError);
      throw;
    }
  };
  CHECK_THROWS_WITH_AS(run_ranks(4, body, {.timeout = 60s}), "boom on rank 3", std::runtime_error);
  for (int r = 0; r < 3; ++r) CHECK(seen[r].find("rank 3 failed: boom on rank 3") != std::string::npos);
}

TEST_CASE("a rank that stalls after a completed collective: the others time out at the next one, naming it") {
  // The all_reduce completes on both ranks; rank 1 then stalls, so rank 0
  // waits at the arrival of barrier #1 until its deadline.
  Outcome o = run_and_record(2, [](Communicator& comm) {
    Tensor t = ones({4});
    comm.all_reduce(t, ReduceOp::sum);
    if (comm.rank() == 1) std::this_thread::sleep_for(1s);
    comm.barrier();
  });
  CHECK(o.type[0] == "timeout");
  CHECK(o.what[0].find("barrier #1 (arrival): ranks 1 did not arrive") != std::string::npos);
  CHECK(!o.agreed[0]);  // rank 1 never raised it: an MPI job must be aborted
}

TEST_CASE("agree_outcome: a rank-local failure makes every rank throw the same error, naming the lowest failing rank") {
  Outcome o = run_and_record(4, [](Communicator& comm) {
    std::string failure = comm.rank() == 1 ? "run directory /x: cannot write in it"
                          : comm.rank() == 3 ? "another reason"
                                             : "";
    agree_outcome(comm, failure);
  });
  for (int r = 0; r < 4; ++r) {
    CHECK(o.type[r] == "other");  // not aborted, not timed out: each rank throws it itself
    CHECK(o.what[r] == "rank 1: run directory /x: cannot write in it (and 1 other rank)");
    CHECK(o.agreed[r]);  // so the MPI backend ends each process without MPI_Abort
  }
  o = run_and_record(2, [](Communicator& comm) { agree_outcome(comm, comm.rank() ? "inf" : "", true); });
  for (int r = 0; r < 2; ++r) CHECK((o.agreed[r] && o.nonfinite[r] && o.what[r] == "rank 1: inf"));
  // Context added on the way up keeps both.
  o = run_and_record(2, [](Communicator& comm) {
    try {
      agree_outcome(comm, comm.rank() ? "inf" : "", true);
    } catch (const NonFiniteError& e) {
      rethrow_nonfinite(e, std::string("step 3: ") + e.what());
    }
  });
  for (int r = 0; r < 2; ++r) CHECK((o.agreed[r] && o.nonfinite[r] && o.what[r] == "step 3: rank 1: inf"));
  o = run_and_record(1, [](Communicator&) {
    try {
      VQDDP_THROW_NONFINITE("a local NaN");
    } catch (const NonFiniteError& e) {
      rethrow_nonfinite(e, std::string("step 3: ") + e.what());
    }
  });
  CHECK((!o.agreed[0] && o.nonfinite[0] && o.what[0] == "step 3: a local NaN"));
  // All fine: nobody throws, and agree_on passes an Error's message on.
  o = run_and_record(3, [](Communicator& comm) { agree_outcome(comm, ""); });
  for (int r = 0; r < 3; ++r) CHECK(o.what[r].empty());
  o = run_and_record(3, [](Communicator& comm) {
    agree_on(comm, comm.rank() == 0, [] { throw Error("refused"); });
  });
  for (int r = 0; r < 3; ++r) CHECK(o.what[r] == "rank 0: refused");
}
