// The thread backend on GPU tensors: every collective on cuda:0 gives the
// CPU's result bitwise, in the caller's storage (invariant 5, also for a
// row view), with the same counters.
#include "comm/thread_group.h"
#include "tests/comm/closed_form.h"
#include "tests/cuda/gpu.h"
#include "tests/vq/harness.h"

using namespace vqddp;
using namespace vqddp::test;

namespace {

// Rank-filled rows: rank r's values are r*100 + position, exact in float.
Tensor rank_rows(int rank, int64_t rows, int64_t cols) {
  std::vector<float> v(rows * cols);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(rank * 100 + static_cast<int64_t>(i));
  return from_vector(v, {rows, cols});
}

struct Result {
  std::vector<float> reduced, broadcast, gathered, gathered_rows;
  CommCounters counters;
  bool in_place = true;
};

std::vector<Result> collectives(int w, Device device) {
  std::vector<Result> out(w);
  run_ranks(w, [&](Communicator& comm) {
    int r = comm.rank();
    Result& res = out[r];
    // all_reduce into a row view of a bigger tensor: the result must land there.
    Tensor big = rank_rows(r, 6, 3).to(device);
    Tensor view = big.slice_rows(2, 5);
    uint64_t version = view.version();
    comm.all_reduce(view, ReduceOp::sum);
    res.in_place &= view.shares_storage(big) && view.version() > version;
    res.reduced = big.to_vector<float>();
    Tensor b = rank_rows(r, 2, 2).to(device);
    comm.broadcast(b, w - 1);
    res.broadcast = b.to_vector<float>();
    // Gathers with a host input and a device output (mixed), and all device.
    Tensor g = empty({2 * w, 3}, DType::f32, device);
    comm.all_gather(rank_rows(r, 2, 3), g);
    res.gathered = g.to_vector<float>();
    std::vector<int64_t> counts;
    for (int q = 0; q < w; ++q) counts.push_back(q % 2 == 0 ? q + 1 : 0);  // some ranks empty
    Tensor rows = empty({std::accumulate(counts.begin(), counts.end(), int64_t{0}), 3}, DType::f32, device);
    comm.all_gather_rows(rank_rows(r, counts[r], 3).to(device), counts, rows);
    res.gathered_rows = rows.to_vector<float>();
    res.counters = comm.counters();
  }, kFast);
  return out;
}

}  // namespace

TEST_CASE("thread-backend collectives on GPU tensors equal the CPU's bitwise, in the caller's storage") {
  for (int w = 1; w <= 4; ++w) {
    CAPTURE(w);
    std::vector<Result> cpu = collectives(w, kCpu), gpu = collectives(w, kGpu);
    for (int r = 0; r < w; ++r) {
      CAPTURE(r);
      CHECK(gpu[r].in_place);
      CHECK(gpu[r].reduced == cpu[r].reduced);
      CHECK(gpu[r].broadcast == cpu[r].broadcast);
      CHECK(gpu[r].gathered == cpu[r].gathered);
      CHECK(gpu[r].gathered_rows == cpu[r].gathered_rows);
      CHECK(gpu[r].counters.collectives == cpu[r].counters.collectives);
      CHECK(gpu[r].counters.bytes == cpu[r].counters.bytes);
    }
  }
}

TEST_CASE("the closed-form checks every backend runs pass on GPU tensors with thread ranks (staged through the host)") {
  for (int w = 1; w <= 4; ++w) {
    CAPTURE(w);
    run_ranks(w, [&](Communicator& comm) { closed_form_collectives(comm, kGpu); }, kFast);
  }
}
