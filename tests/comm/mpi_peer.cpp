// The MPI backend's suite: one process per rank, started by mpirun
// (tests/mpirun.sh), each running the same doctest cases on its rank's
// communicator (same cases, same order: the collectives match).
//   mpirun -np 3 build/tests/mpi_peer
//   mpirun -np 3 build/tests/mpi_peer --scenario skip|late|desync
// The scenarios end the job as a user's failing run would; tests/mpirun.sh
// checks what every rank printed and how the job ended.
// Exits 77 (meson: SKIP) when the build has no MPI.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "comm/mpi_communicator.h"
#include "comm/thread_group.h"
#include "tests/comm/closed_form.h"
#include "tests/vq/quantizer_trace.h"

using namespace vqddp;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

std::unique_ptr<Communicator> g_comm;

// Rank r's values for an all_reduce of n elements: magnitudes spread over
// many binades and both signs, so the order of a sum shows in its bits.
Tensor order_sensitive(int rank, int64_t n, DType dtype) {
  std::mt19937_64 gen(1000003 * (rank + 1) + n);
  std::uniform_real_distribution<double> mantissa(-1, 1);
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<double> v(n);
  for (double& x : v) x = std::ldexp(mantissa(gen), exponent(gen));
  Tensor t = from_vector(v, {n});
  if (dtype == DType::f64) return t;
  Tensor f = empty({n}, DType::f32);
  for (int64_t i = 0; i < n; ++i) f.data<float>()[i] = static_cast<float>(v[i]);
  return f;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("mpi: closed-form collectives on host tensors and on tensors staged from the sim device") {
  test::closed_form_collectives(*g_comm, Device::cpu());
  test::closed_form_collectives(*g_comm, Device::sim());
}

TEST_CASE("mpi: all_reduce gives the thread backend's bits for the same world, on both paths") {
  Communicator& comm = *g_comm;
  const int w = comm.world_size();
  // Below and above kGatherReduceBytes for every world size: 1, 37 and 700
  // take the gather path, 50'000 and 100'003 the reduce-scatter.
  for (int64_t n : {int64_t{1}, int64_t{37}, int64_t{700}, int64_t{50'000}, int64_t{100'003}})
    for (DType dt : {DType::f32, DType::f64})
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
        CAPTURE(n);
        CAPTURE(std::string(dtype_name(dt)));
        CAPTURE(std::string(reduce_op_name(op)));
        Tensor mine = order_sensitive(comm.rank(), n, dt);
        comm.all_reduce(mine, op);
        // The same inputs reduced by W thread ranks in this process.
        std::vector<Tensor> by_threads(w);
        run_ranks(w, [&](Communicator& c) {
          Tensor t = order_sensitive(c.rank(), n, dt);
          c.all_reduce(t, op);
          by_threads[c.rank()] = t;
        });
        CHECK(same_bits(mine, by_threads[0]));
      }
  // In place in a row view (invariant 5) on the reduce-scatter path: the
  // rows around it untouched.
  {
    const int64_t cols = 40'000;
    Tensor frame = order_sensitive(comm.rank(), 3 * cols, DType::f32).reshape({3, cols});
    Tensor before = frame.clone();
    Tensor view = frame.slice_rows(1, 3);
    comm.all_reduce(view, ReduceOp::sum);
    std::vector<Tensor> by_threads(w);
    run_ranks(w, [&](Communicator& c) {
      Tensor t = order_sensitive(c.rank(), 3 * cols, DType::f32).reshape({3, cols}).slice_rows(1, 3).clone();
      c.all_reduce(t, ReduceOp::sum);
      by_threads[c.rank()] = t;
    });
    CHECK(same_bits(view.clone(), by_threads[0]));
    CHECK(same_bits(frame.slice_rows(0, 1).clone(), before.slice_rows(0, 1).clone()));
  }
  // The inputs are order-sensitive: summed in descending rank order (what an
  // MPI_Allreduce may do) some element differs, so the check above could
  // fail. (With two ranks, a + b == b + a: nothing to show.)
  if (w >= 3) {
    const int64_t n = 1000;
    std::vector<Tensor> in;
    for (int r = 0; r < w; ++r) in.push_back(order_sensitive(r, n, DType::f32));
    Tensor ours = order_sensitive(comm.rank(), n, DType::f32);
    comm.all_reduce(ours, ReduceOp::sum);
    int64_t differ = 0;
    for (int64_t i = 0; i < n; ++i) {
      float down = in[w - 1].data<float>()[i];
      for (int r = w - 2; r >= 0; --r) down += in[r].data<float>()[i];
      differ += down != ours.data<float>()[i];
    }
    CHECK(differ > 0);
  }
}

TEST_CASE("mpi: on sim in graphed steps every collective is a launch of the step, and the replays give the issued "
          "collectives' bits, and those of W thread ranks") {
  // comm/staging.h: a collective of a graphed step on sim runs with the
  // step's launches (at its end, or as its replay), MPI calls and all.
  Communicator& comm = *g_comm;
  int64_t replays = 0;
  const std::vector<float> graphed = test::graphed_collectives_trace(comm, true, &replays);
  const std::vector<float> issued = test::graphed_collectives_trace(comm, false, nullptr);
  CHECK(replays == 4);  // steps 2-5 replay step 1's capture
  REQUIRE(graphed.size() == issued.size());
  CHECK(std::memcmp(graphed.data(), issued.data(), issued.size() * sizeof(float)) == 0);
  std::vector<std::vector<float>> by_threads(static_cast<size_t>(comm.world_size()));
  run_ranks(comm.world_size(), [&](Communicator& c) {
    by_threads[c.rank()] = test::graphed_collectives_trace(c, false, nullptr);
  });
  CHECK(issued == by_threads[comm.rank()]);
}

TEST_CASE("mpi: int64 sums are exact and equal on every rank; a 0-element all_reduce takes part (the fingerprint "
          "check would see a rank that skipped it)") {
  Communicator& comm = *g_comm;
  Tensor big = full({70'000}, 0.0, DType::i64);
  for (int64_t i = 0; i < big.numel(); ++i) big.data<int64_t>()[i] = (int64_t{1} << 40) + comm.rank() * i;
  comm.all_reduce(big, ReduceOp::sum);
  int64_t w = comm.world_size();
  for (int64_t i = 0; i < big.numel(); ++i) CHECK(big.data<int64_t>()[i] == w * (int64_t{1} << 40) + w * (w - 1) / 2 * i);
  Tensor none = empty({0}, DType::f32);
  uint64_t before = comm.counters().collectives;
  comm.all_reduce(none, ReduceOp::sum);
  comm.barrier();
  CHECK(comm.counters().collectives == before + 2);
}

TEST_CASE("mpi: every quantizer type, every split of the batch: this rank's state, metrics and rows after every step "
          "are == 1 rank's on the whole batch (invariants 1 and 2 across processes)") {
  Communicator& comm = *g_comm;
  for (const std::string& type : quantizer_types()) {
    CAPTURE(type);
    const QuantizerOptions q = test::options_for(type);
    test::Trace one = test::per_rank(1, [&](Communicator& c) { return test::run(q, c, {test::kRows}); })[0];
    for (const std::string& split : test::kSplitKinds) {
      CAPTURE(split);
      std::vector<int64_t> sizes = test::split_sizes(test::kRows, comm.world_size(), split);
      test::Trace mine = test::run(q, comm, sizes);
      test::check_traces_equal(std::vector<test::Trace>{mine}, one);
      for (int s = 0; s < test::kSteps; ++s) {
        CAPTURE(s);
        CHECK(test::first_difference({{"quantized", mine.quantized[s]}, {"indices", mine.indices[s]}},
                                     {{"quantized", test::shard(one.quantized[s], sizes, comm.rank())},
                                      {"indices", test::shard(one.indices[s], sizes, comm.rank())}}) == "");
      }
    }
  }
}

namespace {

// Rank W-1 skips the second all_reduce and goes on to exit; every other
// rank must get a TimeoutError naming it within the deadline (2 s), print
// it, and end the job.
int scenario_skip() {
  // The processes start together first (under a generous deadline: a busy
  // machine may start them seconds apart), then meet on a 2 s communicator.
  auto start_line = make_mpi_communicator({.timeout = 60s});
  start_line->barrier();
  auto comm = make_mpi_communicator({.timeout = 2s});
  const int r = comm->rank(), w = comm->world_size();
  Tensor t = full({8}, 1.0);
  comm->all_reduce(t, ReduceOp::sum);  // agreed
  if (r == w - 1) {
    std::printf("rank %d: skipping all_reduce #1\n", r);
    std::fflush(stdout);
    return 0;  // its exit waits in MPI_Finalize until the job is ended
  }
  auto start = Clock::now();
  try {
    comm->all_reduce(t, ReduceOp::sum);
    std::printf("rank %d: no error\n", r);
  } catch (const TimeoutError& e) {
    double s = std::chrono::duration<double>(Clock::now() - start).count();
    std::printf("rank %d: TimeoutError after %.1f s: %s\n", r, s, e.what());
    try {
      comm->barrier();
    } catch (const TimeoutError&) {
      std::printf("rank %d: the next call raised it again\n", r);
    }
  }
  std::fflush(stdout);
  // Every waiting rank reaches its deadline at about the same moment (the
  // script accepts up to 2 s late): let them all print before the first
  // one's abort ends the job.
  std::this_thread::sleep_for(3s);
  return 0;  // the failed communicator's destructor ends the job
}

// The last process creates its second communicator 4 s late: every other
// one gets a TimeoutError from the creation at its 2 s deadline and exits,
// and the job ends (no process waits forever in MPI_Finalize for the late
// one). (The first communicator starts MPI, whose MPI_Init waits for every
// process with no deadline of ours: mpirun ends a job whose process dies
// before it.)
int scenario_late() {
  auto first = make_mpi_communicator({.timeout = 60s});
  const int r = first->rank(), w = first->world_size();
  first->barrier();
  if (r == w - 1) std::this_thread::sleep_for(4s);
  auto start = Clock::now();
  try {
    auto comm = make_mpi_communicator({.timeout = 2s});
    std::printf("rank %d: no error\n", r);
  } catch (const TimeoutError& e) {
    double s = std::chrono::duration<double>(Clock::now() - start).count();
    std::printf("rank %d: TimeoutError after %.1f s: %s\n", r, s, e.what());
    std::fflush(stdout);
    // Every waiting rank prints before the first exit ends the job (the
    // script accepts timeouts up to 2 s late).
    std::this_thread::sleep_for(3s);
    return 1;
  }
  std::fflush(stdout);
  return 0;
}

// With the fingerprint check on, rank 0 sums where the others take the max:
// every rank gets the DesyncError, listing every rank's call.
int scenario_desync() {
  auto comm = make_mpi_communicator({.timeout = 30s, .check_fingerprints = true});
  const int r = comm->rank();
  Tensor t = full({8}, 1.0);
  comm->all_reduce(t, ReduceOp::sum);
  try {
    comm->all_reduce(t, r == 0 ? ReduceOp::sum : ReduceOp::max);
    std::printf("rank %d: no error\n", r);
  } catch (const DesyncError& e) {
    std::printf("rank %d: DesyncError: %s\n", r, e.what());
    try {
      comm->barrier();
    } catch (const DesyncError&) {
      std::printf("rank %d: the next call raised it again\n", r);
    }
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (!mpi_built()) {
    std::printf("mpi_peer skipped: this build has no MPI\n");
    return 77;
  }
  if (argc == 3 && std::strcmp(argv[1], "--scenario") == 0) {
    if (std::strcmp(argv[2], "skip") == 0) return scenario_skip();
    if (std::strcmp(argv[2], "desync") == 0) return scenario_desync();
    if (std::strcmp(argv[2], "late") == 0) return scenario_late();
    std::fprintf(stderr, "mpi_peer: unknown scenario '%s'\n", argv[2]);
    return 2;
  }
  try {
    // With the fingerprint check: a case that fails on one rank only (and
    // skips its remaining collectives) is a DesyncError on every rank, not
    // gathers of different sizes matched by MPI.
    g_comm = make_mpi_communicator({.timeout = 60s, .check_fingerprints = true});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_peer: %s\n", e.what());
    return 2;
  }
  doctest::Context context(argc, argv);
  int rc = context.run();
  g_comm.reset();
  return rc;
}
