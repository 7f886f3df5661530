// Closed-form results of every collective for W = 1..8, with rank-filled
// tensors so every expectation is exact.
#include <doctest/doctest.h>

#include <cstring>
#include <numeric>
#include <optional>

#include "comm/backends.h"
#include "tests/comm/closed_form.h"
#include "comm/single.h"
#include "comm/thread_group.h"
#include "engine/ops.h"
#include "engine/core/random.h"
#include "engine/device_counters.h"
#include "engine/step_graph.h"

using namespace vqddp;

namespace {
constexpr ThreadGroupOptions kFast{.timeout = std::chrono::milliseconds(2000)};
// 37 elements: not a multiple of the 16-element shares the ranks split.
constexpr int64_t kN = 37;
}  // namespace

TEST_CASE("all_reduce sum, avg, max, min of rank-filled tensors, float32 and int64, W = 1..8") {
  for (int w = 1; w <= 8; ++w) {
    CAPTURE(w);
    run_ranks(w, [&](Communicator& comm) {
      int r = comm.rank();
      // t[i] = 1000 r + i, so sum[i] = 1000 W(W-1)/2 + W i, exact in float32.
      auto filled = [&](DType dt) {
        Tensor t = arange(kN, dt);
        Tensor base = full({kN}, 1000.0 * r, dt);
        if (dt == DType::f32) return add(t, base);
        for (int64_t i = 0; i < kN; ++i) t.data<int64_t>()[i] += 1000 * r;
        return t;
      };
      for (DType dt : {DType::f32, DType::i64}) {
        Tensor s = filled(dt), mx = filled(dt), mn = filled(dt);
        comm.all_reduce(s, ReduceOp::sum);
        comm.all_reduce(mx, ReduceOp::max);
        comm.all_reduce(mn, ReduceOp::min);
        for (int64_t i = 0; i < kN; ++i) {
          double sum = 1000.0 * w * (w - 1) / 2 + double(w) * i;
          double got = dt == DType::f32 ? s.data<float>()[i] : double(s.data<int64_t>()[i]);
          double gmax = dt == DType::f32 ? mx.data<float>()[i] : double(mx.data<int64_t>()[i]);
          double gmin = dt == DType::f32 ? mn.data<float>()[i] : double(mn.data<int64_t>()[i]);
          CHECK(got == sum);
          CHECK(gmax == 1000.0 * (w - 1) + i);
          CHECK(gmin == double(i));
        }
      }
      Tensor avg = full({kN}, r + 1.0);
      comm.all_reduce(avg, ReduceOp::avg);
      for (float v : avg.to_vector<float>()) CHECK(v == (w + 1) / 2.f);
    }, kFast);
  }
}

TEST_CASE("broadcast from every root, W = 1..8") {
  for (int w = 1; w <= 8; ++w)
    for (int root = 0; root < w; ++root) {
      CAPTURE(w);
      CAPTURE(root);
      run_ranks(w, [&](Communicator& comm) {
        Tensor t = add(arange(kN, DType::f32), 100.f * comm.rank());
        Tensor ids = full({3}, comm.rank(), DType::i64);
        comm.broadcast(t, root);
        comm.broadcast(ids, root);
        for (int64_t i = 0; i < kN; ++i) CHECK(t.data<float>()[i] == 100.f * root + i);
        CHECK(ids.to_vector<int64_t>() == std::vector<int64_t>(3, root));
      }, kFast);
    }
}

TEST_CASE("all_gather of equal sizes puts rank r's rows at block r, W = 1..8") {
  for (int w = 1; w <= 8; ++w) {
    CAPTURE(w);
    run_ranks(w, [&](Communicator& comm) {
      Tensor in = full({2, 3}, comm.rank());
      Tensor out = zeros({2 * w, 3});
      comm.all_gather(in, out);
      auto v = out.to_vector<float>();
      for (int r = 0; r < w; ++r)
        for (int j = 0; j < 6; ++j) CHECK(v[r * 6 + j] == float(r));
      // The allocating form and the row-count helper agree.
      CHECK(all_gather(comm, in).to_vector<float>() == v);
      std::vector<int64_t> counts = all_gather_counts(comm, comm.rank() + 5);
      for (int r = 0; r < w; ++r) CHECK(counts[r] == r + 5);
    }, kFast);
  }
}

TEST_CASE("all_gather_rows with per-rank counts, including ranks with no rows, W = 1..8") {
  for (int w = 1; w <= 8; ++w) {
    CAPTURE(w);
    run_ranks(w, [&](Communicator& comm) {
      int r = comm.rank();
      int64_t mine = r % 3;  // ranks 0, 3, 6 have no rows
      Tensor in = full({mine, 4}, 10.0 * r, DType::i64);
      std::vector<int64_t> counts = all_gather_counts(comm, mine);
      Tensor out = all_gather_rows(comm, in, counts);
      int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
      REQUIRE(out.shape() == Shape{total, 4});
      const int64_t* p = out.data<int64_t>();
      for (int src = 0; src < w; ++src)
        for (int64_t k = 0; k < src % 3; ++k)
          for (int j = 0; j < 4; ++j) CHECK(*p++ == 10 * src);
    }, kFast);
  }
}

TEST_CASE("all_gather_rows where every rank is empty gathers nothing, alike on all ranks") {
  run_ranks(3, [&](Communicator& comm) {
    std::vector<int64_t> counts = all_gather_counts(comm, 0);
    Tensor out = all_gather_rows(comm, zeros({0, 5}), counts);
    CHECK(out.shape() == Shape{0, 5});
  }, kFast);
}

TEST_CASE("invariant 5: a collective on a row slice writes into the caller's storage") {
  run_ranks(4, [&](Communicator& comm) {
    Tensor whole = full({6, 2}, comm.rank());  // (6, 2)
    Tensor rows = whole.slice_rows(2, 4);      // view of rows 2..3
    comm.all_reduce(rows, ReduceOp::sum);
    auto v = whole.to_vector<float>();
    for (int i = 0; i < 12; ++i) CHECK(v[i] == (i >= 4 && i < 8 ? 6.f : float(comm.rank())));
    CHECK(rows.shares_storage(whole));
    // The write is visible to autograd's in-place check.
    uint64_t before = whole.version();
    comm.all_reduce(rows, ReduceOp::sum);
    CHECK(whole.version() == before + 1);
  }, kFast);
}

TEST_CASE("counters count collectives and the bytes each touches") {
  run_ranks(3, [&](Communicator& comm) {
    CHECK(comm.counters().collectives == 0);
    Tensor t = zeros({10});
    comm.all_reduce(t, ReduceOp::sum);  // 40 bytes
    comm.broadcast(t, 1);               // 40 bytes
    Tensor out = zeros({6});
    comm.all_gather(zeros({2}), out);   // 24 bytes gathered
    comm.barrier();
    CHECK(comm.counters().collectives == 4);
    CHECK(comm.counters().bytes == 104);
  }, kFast);
}

TEST_CASE("bitwise determinism: the same float all_reduce twice gives identical bits on every rank") {
  auto once = [](int w) {
    std::vector<std::vector<float>> result(w);
    run_ranks(w, [&](Communicator& comm) {
      Generator g(77, Generator::rank_stream(0, comm.rank()));
      Tensor t = rand_normal({4099}, g, 0.f, 1e3f);  // large spread: order matters for rounding
      comm.all_reduce(t, ReduceOp::sum);
      result[comm.rank()] = t.to_vector<float>();
    }, kFast);
    return result;
  };
  for (int w : {3, 5, 8}) {
    auto a = once(w), b = once(w);
    for (int r = 0; r < w; ++r) {
      CHECK(std::memcmp(a[r].data(), b[r].data(), a[r].size() * 4) == 0);
      CHECK(std::memcmp(a[r].data(), a[0].data(), a[r].size() * 4) == 0);
    }
    // And it is exactly the ascending-rank-order float sum.
    std::vector<Tensor> inputs;
    for (int r = 0; r < w; ++r) {
      Generator g(77, Generator::rank_stream(0, r));
      inputs.push_back(rand_normal({4099}, g, 0.f, 1e3f));
    }
    for (int64_t i = 0; i < 4099; ++i) {
      float acc = inputs[0].data<float>()[i];
      for (int r = 1; r < w; ++r) acc = acc + inputs[r].data<float>()[i];
      REQUIRE(a[0][i] == acc);
    }
  }
}

TEST_CASE("the single communicator is the world of one") {
  SingleCommunicator comm;
  Tensor t = from_vector({1, 2}, {2});
  comm.all_reduce(t, ReduceOp::avg);
  comm.broadcast(t, 0);
  CHECK(t.to_vector<float>() == std::vector<float>{1, 2});
  CHECK(all_gather(comm, t.reshape({2, 1})).to_vector<float>() == std::vector<float>{1, 2});
  CHECK(all_gather_rows(comm, zeros({0, 3}), {0}).shape() == Shape{0, 3});
  CHECK_THROWS_WITH_AS(comm.broadcast(t, 1), doctest::Contains("root 1 outside world of 1"), Error);
  CHECK(comm.counters().collectives == 4);
}

TEST_CASE("launch_ranks picks the backend by name and rejects unknown names") {
  std::atomic<int> seen{0};
  launch_ranks({.backend = "thread", .world_size = 3}, [&](Communicator& comm) {
    CHECK(comm.backend() == "thread");
    seen += comm.world_size();
  });
  CHECK(seen == 9);
  launch_ranks({.backend = "single"}, [&](Communicator& comm) { CHECK(comm.backend() == "single"); });
  CHECK_THROWS_WITH_AS(launch_ranks({.backend = "single", .world_size = 2}, [](Communicator&) {}),
                       doctest::Contains("exactly one rank"), Error);
  CHECK_THROWS_WITH_AS(launch_ranks({.backend = "gloo"}, [](Communicator&) {}),
                       doctest::Contains("unknown communication backend 'gloo' (known: single, thread, nccl, mpi)"),
                       Error);
}

TEST_CASE("argument errors name the rank") {
  // A negative count could still add up to the right total.
  CHECK_THROWS_WITH_AS(run_ranks(2, [](Communicator& comm) {
                         Tensor out = zeros({1, 2});
                         comm.all_gather_rows(zeros({comm.rank() == 0 ? 2 : 0, 2}), {2, -1}, out);
                       }, kFast),
                       doctest::Contains("all_gather_rows counts[1] = -1 is negative"), Error);
  CHECK_THROWS_WITH_AS(run_ranks(2, [](Communicator& comm) {
                         Tensor t = arange(3);
                         comm.all_reduce(t, ReduceOp::avg);
                       }, kFast),
                       doctest::Contains("all_reduce(avg) needs a float tensor"), Error);
  CHECK_THROWS_WITH_AS(run_ranks(2, [](Communicator& comm) {
                         Tensor out = zeros({3, 2});
                         comm.all_gather(zeros({1, 2}), out);
                       }, kFast),
                       doctest::Contains("all_gather output is float32[3, 2] on cpu, expected float32[2, 2]"), Error);
}

TEST_CASE("the closed-form checks every backend runs (tests/comm/closed_form.h) pass on the thread backend, W = 1..8") {
  for (int w = 1; w <= 8; ++w) {
    CAPTURE(w);
    run_ranks(w, [&](Communicator& comm) { test::closed_form_collectives(comm, Device::cpu()); }, kFast);
  }
}

TEST_CASE("reduce_units of column blocks: the bits of reduce_units on their concatenation, W = 1..5, host and sim") {
  // Communicator::reduce_units on blocks makes no packed copy where the
  // transport needs none (a world of one adds on the device, the thread
  // backend reads the blocks in place); the sums must still be the
  // concatenation's: each column over the global units in order, in
  // double, rounded once. Wide-ranged values make another order show.
  const std::vector<int64_t> widths{3, 1, 40, 5, 18};  // 67 columns: the ranks' shares cut blocks
  for (Device dev : {Device::cpu(), Device::sim()})
    for (int w = 1; w <= 5; ++w) {
      CAPTURE(w);
      CAPTURE(dev.str());
      std::vector<int64_t> counts;
      for (int r = 0; r < w; ++r) counts.push_back((r * 2) % 3 + 3);  // uneven: 3, 5, 4, 3, 5 units
      const int64_t units = std::accumulate(counts.begin(), counts.end(), int64_t{0}), cols = 67;
      // The global units' rows and their reference sums.
      Generator gen(9, 1);
      Tensor all = mul(rand_normal({units, cols}, gen), exp(mul(rand_normal({units, cols}, gen), 15.f)));
      // Column 0 of the first units: 1 + 2^100 - 2^100 is 0 in ascending
      // order (the 1 is lost) and 1 in any order that adds the two first.
      all.data<float>()[0] = 1.f, all.data<float>()[cols] = 0x1p100f, all.data<float>()[2 * cols] = -0x1p100f;
      std::vector<float> want(static_cast<size_t>(cols));
      for (int64_t j = 0; j < cols; ++j) {
        double acc = 0;
        for (int64_t u = 0; u < units; ++u) acc += all.data<float>()[u * cols + j];
        want[static_cast<size_t>(j)] = static_cast<float>(acc);
      }
      std::vector<std::vector<float>> by_blocks(static_cast<size_t>(w)), packed(static_cast<size_t>(w));
      run_ranks(w, [&](Communicator& comm) {
        const int r = comm.rank();
        const int64_t first = std::accumulate(counts.begin(), counts.begin() + r, int64_t{0});
        Tensor mine = all.slice_rows(first, first + counts[r]).clone();
        std::vector<Tensor> blocks;
        int64_t at = 0;
        for (int64_t width : widths) {
          Tensor b = empty({counts[r], width});
          for (int64_t u = 0; u < counts[r]; ++u)
            for (int64_t j = 0; j < width; ++j) b.data<float>()[u * width + j] = mine.data<float>()[u * cols + at + j];
          blocks.push_back(b.to(dev));
          at += width;
        }
        Tensor out = empty({cols}, DType::f32, dev), whole = empty({cols}, DType::f32, dev);
        comm.reduce_units(blocks, counts, out);
        comm.reduce_units(mine.to(dev), counts, whole);
        by_blocks[r] = out.to(Device::cpu()).to_vector<float>();
        packed[r] = whole.to(Device::cpu()).to_vector<float>();
      }, kFast);
      for (int r = 0; r < w; ++r) {
        CHECK(std::memcmp(by_blocks[r].data(), want.data(), want.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(packed[r].data(), want.data(), want.size() * sizeof(float)) == 0);
      }
    }
}

namespace {

// Rank 0 of a world of two whose peer's rows are given: the default
// transports (MPI's, NCCL's) gather with all_gather_rows and add the rows
// themselves (Communicator::do_reduce_units).
class GatheringPair final : public Communicator {
 public:
  explicit GatheringPair(Tensor peer) : peer_(std::move(peer)) {}
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  std::string backend() const override { return "test pair"; }

 protected:
  void do_all_reduce(Tensor&, ReduceOp, const Fingerprint&) override { FAIL("not used"); }
  void do_broadcast(Tensor&, int, const Fingerprint&) override { FAIL("not used"); }
  void do_all_gather(const Tensor&, Tensor&, const Fingerprint&) override { FAIL("not used"); }
  void do_all_gather_rows(const Tensor& in, const std::vector<int64_t>&, Tensor& out, const Fingerprint&) override {
    out.copy_(concat({in, peer_.to(in.device())}, 0));
  }
  void do_barrier(const Fingerprint&) override {}

 private:
  Tensor peer_;
};

}  // namespace

TEST_CASE("the default transport adds any number of gathered units in ascending order with the unit-sum kernel, "
          "host and sim") {
  // 300 units: a GPU's sum along dimension 0 runs a strided block and a
  // tree beyond 64 rows, which once made N GPUs (NCCL) equal 1 GPU only up
  // to 64 units. Column 0 is 1 + 2^100 - 2^100 then 297 ones: 297 in
  // ascending order, 298 in the GPU tree's (256 threads, then halving),
  // whose thread 0 adds the 1 and unit 256's one before the 2^100 of
  // thread 1 comes in.
  const int64_t units = 300, cols = 5, mine = 120;
  std::vector<float> v(static_cast<size_t>(units * cols), 1.f);
  v[cols] = 0x1p100f, v[2 * cols] = -0x1p100f;
  auto ascending = [&](int64_t j) {
    double acc = 0;
    for (int64_t u = 0; u < units; ++u) acc += v[static_cast<size_t>(u * cols + j)];
    return static_cast<float>(acc);
  };
  auto gpu_tree = [&](int64_t j) {  // kernels_reduce.cu reduce_block_kernel's order
    std::vector<double> part(256, 0.0);
    for (int t = 0; t < 256; ++t)
      for (int64_t u = t; u < units; u += 256) part[static_cast<size_t>(t)] += v[static_cast<size_t>(u * cols + j)];
    for (int step = 128; step > 0; step /= 2)
      for (int t = 0; t < step; ++t) part[static_cast<size_t>(t)] += part[static_cast<size_t>(t + step)];
    return static_cast<float>(part[0]);
  };
  REQUIRE(ascending(0) == 297.f);
  REQUIRE(gpu_tree(0) != ascending(0));  // the values tell the two orders apart
  Tensor all = from_vector(v, {units, cols});
  for (Device dev : {Device::cpu(), Device::sim()}) {
    CAPTURE(dev.str());
    GatheringPair comm(all.slice_rows(mine, units).clone());
    Tensor out = empty({cols}, DType::f32, dev);
    LaunchRecording rec;
    comm.reduce_units(all.slice_rows(0, mine).clone().to(dev), {mine, units - mine}, out);
    std::vector<float> got = out.to(Device::cpu()).to_vector<float>();
    for (int64_t j = 0; j < cols; ++j) CHECK(got[static_cast<size_t>(j)] == ascending(j));
    if (dev.is_cpu()) continue;
    // On a device, by the unit-sum kernel: the one whose order is written
    // for every device (a GPU runs the same per-column loop).
    bool unit_sums = false, reduce_sum = false;
    for (const LaunchRecord& l : rec.launches) {
      unit_sums |= std::string(l.kernel) == "unit_sums";
      reduce_sum |= std::string(l.kernel) == "reduce_sum";
    }
    CHECK(unit_sums);
    CHECK_FALSE(reduce_sum);
  }
}

TEST_CASE("thread ranks on sim in graphed steps: every collective is a launch of the step, and the replays give the "
          "issued collectives' bits, W = 3") {
  // comm/thread_group.cpp: in a graphed step a collective of sim tensors
  // is recorded with the step's launches and run with them (at the step's
  // end, or as its replay), rendezvous and all (closed_form.h's trace; the
  // mpi suite runs the same on processes).
  const int w = 3;
  auto run = [&](bool graphed, std::vector<int64_t>* replays) {
    std::vector<std::vector<float>> got(w);
    run_ranks(w, [&](Communicator& comm) {
      got[comm.rank()] = test::graphed_collectives_trace(comm, graphed, replays ? &(*replays)[comm.rank()] : nullptr);
    }, kFast);
    return got;
  };
  std::vector<int64_t> replays(w);
  std::vector<std::vector<float>> graphed = run(true, &replays), issued = run(false, nullptr);
  for (int r = 0; r < w; ++r) {
    CAPTURE(r);
    CHECK(replays[r] == 4);  // steps 2-5 replay step 1's capture
    REQUIRE(graphed[r].size() == issued[r].size());
    CHECK(std::memcmp(graphed[r].data(), issued[r].data(), issued[r].size() * sizeof(float)) == 0);
    CHECK(issued[r] == issued[0]);  // every collective's result is every rank's
  }
}
