// The comm interface's closed-form checks, written once for every backend:
// called on every rank of a group (thread ranks, NCCL processes), with the
// rank's tensors on `device`. Rank-filled tensors make every expectation
// exact: rank r contributes 1000 r + i at element i.
#pragma once

#include <doctest/doctest.h>

#include <numeric>
#include <optional>
#include <vector>

#include "comm/communicator.h"
#include "engine/ops.h"
#include "engine/step_graph.h"

namespace vqddp::test {

inline Tensor rank_filled(int rank, int64_t n, DType dtype, Device device) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = 1000.0 * rank + double(i);
  Tensor t = from_vector(v, {n});  // float64, exact
  if (dtype == DType::f64) return t.to(device);
  Tensor out = empty({n}, dtype);
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == DType::f32) out.data<float>()[i] = static_cast<float>(v[i]);
    else out.data<int64_t>()[i] = static_cast<int64_t>(v[i]);
  }
  return out.to(device);
}

inline std::vector<double> as_doubles(const Tensor& t) {
  Tensor h = t.to(Device::cpu());
  std::vector<double> out(h.numel());
  for (int64_t i = 0; i < h.numel(); ++i)
    out[i] = h.dtype() == DType::f32 ? h.data<float>()[i] : h.dtype() == DType::f64 ? h.data<double>()[i]
                                                                                     : double(h.data<int64_t>()[i]);
  return out;
}

inline void closed_form_collectives(Communicator& comm, Device device) {
  const int w = comm.world_size(), r = comm.rank();
  const int64_t n = 37;  // not a multiple of any block size
  CommCounters before = comm.counters();
  for (DType dt : {DType::f32, DType::f64, DType::i64}) {
    CAPTURE(std::string(dtype_name(dt)));  // a const char* would log its address
    Tensor s = rank_filled(r, n, dt, device), mx = s.clone(), mn = s.clone();
    comm.all_reduce(s, ReduceOp::sum);
    comm.all_reduce(mx, ReduceOp::max);
    comm.all_reduce(mn, ReduceOp::min);
    std::vector<double> gs = as_doubles(s), gx = as_doubles(mx), gn = as_doubles(mn);
    for (int64_t i = 0; i < n; ++i) {
      CHECK(gs[i] == 1000.0 * w * (w - 1) / 2 + double(w) * i);
      CHECK(gx[i] == 1000.0 * (w - 1) + i);
      CHECK(gn[i] == double(i));
    }
    if (dt != DType::i64) {
      Tensor avg = full({n}, r + 1.0, dt, device);  // mean of 1..W: exact in binary for W <= 8
      comm.all_reduce(avg, ReduceOp::avg);
      for (double v : as_doubles(avg)) CHECK(v == (w + 1) / 2.0);
    }
  }
  // In place in a row view (invariant 5): the rest of the tensor untouched.
  Tensor big = full({6, 3}, r + 1.0, DType::f32, device);
  Tensor view = big.slice_rows(2, 5);
  comm.all_reduce(view, ReduceOp::sum);
  std::vector<double> gb = as_doubles(big);
  for (int64_t i = 0; i < 18; ++i) CHECK(gb[i] == (i >= 6 && i < 15 ? w * (w + 1) / 2.0 : r + 1.0));
  for (int root = 0; root < w; ++root) {
    Tensor b = rank_filled(r, 5, DType::f32, device);
    comm.broadcast(b, root);
    std::vector<double> gv = as_doubles(b);
    for (int64_t i = 0; i < 5; ++i) CHECK(gv[i] == 1000.0 * root + i);
  }
  // all_gather: rank q's 4 elements land at block q.
  Tensor g = empty({4 * w}, DType::i64, device);
  comm.all_gather(rank_filled(r, 4, DType::i64, device), g);
  std::vector<double> gg = as_doubles(g);
  for (int q = 0; q < w; ++q)
    for (int64_t i = 0; i < 4; ++i) CHECK(gg[q * 4 + i] == 1000.0 * q + i);
  // all_gather_rows: rank q sends q % 3 rows of 2 (ranks 0, 3, 6 send none).
  std::vector<int64_t> counts;
  for (int q = 0; q < w; ++q) counts.push_back(q % 3);
  int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  Tensor rows = empty({total, 2}, DType::f32, device);
  comm.all_gather_rows(rank_filled(r, counts[r] * 2, DType::f32, device).reshape({counts[r], 2}), counts, rows);
  std::vector<double> gr = as_doubles(rows);
  size_t at = 0;
  for (int q = 0; q < w; ++q)
    for (int64_t i = 0; i < counts[q] * 2; ++i) CHECK(gr[at++] == 1000.0 * q + i);
  // Host inputs work on every backend (staged where needed).
  CHECK(all_gather_counts(comm, r + 10) == [&] {
    std::vector<int64_t> v;
    for (int q = 0; q < w; ++q) v.push_back(q + 10);
    return v;
  }());
  // Invariant 5 for the other collectives: outputs that are row views of a
  // bigger buffer (staged or not) are written in place, rows around them
  // untouched, and their version bumped.
  Tensor frame = full({4 * w + 2, 2}, -1.0, DType::f32, device);
  Tensor into = frame.slice_rows(1, 1 + 2 * w);
  uint64_t version = into.version();
  comm.all_gather(full({2, 2}, r + 1.0, DType::f32, device), into);
  CHECK(into.version() > version);
  Tensor rows_into = frame.slice_rows(1 + 2 * w, 1 + 2 * w + total);
  comm.all_gather_rows(full({counts[r], 2}, r + 1.0, DType::f32, device), counts, rows_into);
  Tensor root_view = frame.slice_rows(4 * w + 1, 4 * w + 2);
  if (r == 0) root_view.fill_(7.0);
  comm.broadcast(root_view, 0);
  std::vector<double> gf = as_doubles(frame);
  CHECK(gf[0] == -1.0);
  CHECK(gf[1] == -1.0);
  for (int q = 0; q < w; ++q)
    for (int64_t i = 0; i < 4; ++i) CHECK(gf[2 + q * 4 + i] == q + 1.0);
  at = 2 + 4 * w;
  for (int q = 0; q < w; ++q)
    for (int64_t i = 0; i < counts[q] * 2; ++i) CHECK(gf[at++] == q + 1.0);
  for (size_t i = at; i < gf.size() - 2; ++i) CHECK(gf[i] == -1.0);  // rows no collective wrote
  CHECK(gf[gf.size() - 2] == 7.0);
  CHECK(gf[gf.size() - 1] == 7.0);
  // An in-place all_gather: this rank's input is its own block of the output.
  Tensor whole = full({2 * w, 3}, -1.0, DType::f32, device);
  whole.slice_rows(2 * r, 2 * r + 2).fill_(r + 5.0);
  comm.all_gather(whole.slice_rows(2 * r, 2 * r + 2), whole);
  std::vector<double> gw = as_doubles(whole);
  for (int q = 0; q < w; ++q)
    for (int64_t i = 0; i < 6; ++i) CHECK(gw[q * 6 + i] == q + 5.0);
  // An in-place all_gather_rows: this rank's rows already sit at its offset
  // in the output (ranks with no rows pass an empty view of it).
  Tensor all_rows = full({total, 2}, -1.0, DType::f32, device);
  int64_t offset = std::accumulate(counts.begin(), counts.begin() + r, int64_t{0});
  Tensor own_rows = all_rows.slice_rows(offset, offset + counts[r]);
  own_rows.copy_(rank_filled(r, counts[r] * 2, DType::f32, device).reshape({counts[r], 2}));
  comm.all_gather_rows(own_rows, counts, all_rows);
  std::vector<double> ga = as_doubles(all_rows);
  at = 0;
  for (int q = 0; q < w; ++q)
    for (int64_t i = 0; i < counts[q] * 2; ++i) CHECK(ga[at++] == 1000.0 * q + i);
  comm.barrier();
  // 3 dtypes x (3 + avg for floats) + view + W broadcasts + gather + rows + counts + 3 into views + in-place
  // gather + in-place rows + barrier.
  CHECK(comm.counters().collectives - before.collectives == uint64_t(3 * 3 + 2 + 1 + w + 1 + 1 + 1 + 3 + 1 + 1 + 1));
}

// Five steps of every collective on sim tensors, graphed (a StepGraph
// around each step) or issued, for any backend whose collectives are
// launches of a graphed step on sim (comm/staging.h: thread, mpi). Each step
// uploads its own values, so a replay that reused the captured step's would
// show; the results are folded into state tensors across the steps. Rank r
// holds r == 1 ? 0 : r + 2 rows (one rank with none). Returns the states'
// values and, through `replays`, the steps replayed.
inline std::vector<float> graphed_collectives_trace(Communicator& comm, bool graphed, int64_t* replays) {
  const int w = comm.world_size(), r = comm.rank();
  const Device sim = Device::sim();
  std::vector<int64_t> counts(static_cast<size_t>(w));
  for (int q = 0; q < w; ++q) counts[q] = q == 1 ? 0 : q + 2;
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const int64_t offset = std::accumulate(counts.begin(), counts.begin() + r, int64_t{0});
  auto upload = [&](Shape shape, int step, float scale) {
    Tensor h = empty(shape);
    for (int64_t i = 0; i < h.numel(); ++i)
      h.data<float>()[i] = scale * static_cast<float>((step * 7 + r * 3 + i) % 11) / 3.f + 1e-3f * static_cast<float>(step);
    return h.to(sim);
  };
  Tensor reduced = zeros({6}, DType::f32, sim), sent = zeros({6}, DType::f32, sim),
         gathered = zeros({6 * w}, DType::f32, sim), rows = zeros({total, 2}, DType::f32, sim),
         in_place = zeros({total, 2}, DType::f32, sim), units = zeros({4}, DType::f32, sim);
  std::optional<StepGraph> graph;
  if (graphed) graph.emplace(sim);
  for (int step = 1; step <= 5; ++step) {
    if (graph) graph->begin_step(step);
    Tensor x = upload({6}, step, 1.f);
    Tensor s = add(x, 0.f), b = add(x, 0.f);
    Tensor g = empty({6 * w}, DType::f32, sim), gr = empty({total, 2}, DType::f32, sim);
    comm.all_reduce(s, ReduceOp::sum);
    comm.broadcast(b, w - 1);
    comm.all_gather(x, g);
    comm.all_gather_rows(upload({counts[r], 2}, step, 2.f), counts, gr);
    // In place: this rank's rows already sit at its offset in the output.
    Tensor ip = zeros({total, 2}, DType::f32, sim);
    Tensor own = ip.slice_rows(offset, offset + counts[r]);
    own.copy_(upload({counts[r], 2}, step, 4.f));
    comm.all_gather_rows(own, counts, ip);
    Tensor u = empty({4}, DType::f32, sim);
    comm.reduce_units({upload({counts[r], 1}, step, 3.f), upload({counts[r], 3}, step, 5.f)}, counts, u);
    for (auto [state, result] :
         {std::pair{&reduced, &s}, {&sent, &b}, {&gathered, &g}, {&rows, &gr}, {&in_place, &ip}, {&units, &u}})
      state->copy_(add(mul(*state, 0.5f), *result));
    if (graph) graph->end_step();
  }
  std::vector<float> got;
  for (const Tensor* t : {&reduced, &sent, &gathered, &rows, &in_place, &units})
    for (float v : t->to(Device::cpu()).to_vector<float>()) got.push_back(v);
  if (replays) *replays = graph ? graph->replays() : 0;
  return got;
}

}  // namespace vqddp::test
