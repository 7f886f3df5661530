#include "vq/sampler.h"

#include <algorithm>
#include <numeric>
#include <unordered_map>

#include "engine/ops.h"

namespace vqddp {

std::vector<int64_t> draw_row_numbers(int64_t n, int64_t m, Generator& shared) {
  VQDDP_CHECK(n >= 0 && m >= 0, "draw_row_numbers({}, {}): negative size", n, m);
  std::vector<int64_t> drawn(m);
  if (n == 0) return {};
  if (n >= m) {
    // Partial Fisher-Yates over the virtual array 0..n-1: only displaced
    // slots are stored, so the cost is O(m) whatever n is.
    std::unordered_map<int64_t, int64_t> moved;
    auto at = [&](int64_t i) {
      auto it = moved.find(i);
      return it == moved.end() ? i : it->second;
    };
    for (int64_t i = 0; i < m; ++i) {
      int64_t j = i + static_cast<int64_t>(shared.uniform_int(static_cast<uint64_t>(n - i)));
      int64_t vi = at(i), vj = at(j);
      drawn[i] = vj;
      moved[j] = vi;
    }
  } else {
    for (int64_t i = 0; i < m; ++i) drawn[i] = static_cast<int64_t>(shared.uniform_int(static_cast<uint64_t>(n)));
  }
  return drawn;
}

Tensor sample_rows(const Tensor& x, int64_t m, Communicator& comm, Generator& shared) {
  VQDDP_CHECK(x.dim() == 2, "rank {}: sample_rows expects rows [n, D], got {}", comm.rank(), x.desc());
  int64_t d = x.size(1);
  std::vector<int64_t> counts = all_gather_counts(comm, x.size(0));  // (W)
  int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  if (total == 0 || m == 0) return zeros({0, d}, DType::f32, x.device());
  std::vector<int64_t> drawn = draw_row_numbers(total, m, shared);  // global row numbers, draw order

  // Draw positions sorted by global row number (stable: equal rows keep draw
  // order), which is the order the gathered block arrives in.
  std::vector<int64_t> order(m);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return drawn[a] < drawn[b]; });

  int rank = comm.rank(), world = comm.world_size();
  std::vector<int64_t> first(world + 1, 0);  // first global row of each rank
  for (int r = 0; r < world; ++r) first[r + 1] = first[r] + counts[r];
  std::vector<int64_t> share(world, 0);
  for (int64_t g : drawn) share[std::upper_bound(first.begin(), first.end(), g) - first.begin() - 1]++;

  // This rank's drawn rows in ascending global row order, then every rank's
  // block in rank order, then back to draw order: index_select both times,
  // so x may live on any device.
  std::vector<int64_t> local;
  for (int64_t pos : order) {
    int64_t g = drawn[pos];
    if (g >= first[rank] && g < first[rank + 1]) local.push_back(g - first[rank]);
  }
  Tensor mine = index_select(x.detach(), from_vector(local, {share[rank]}).to(x.device()), Indices::trusted);  // (share, D)
  Tensor sorted = all_gather_rows(comm, mine, share);  // (m, D), ascending global row
  std::vector<int64_t> inverse(m);
  for (int64_t i = 0; i < m; ++i) inverse[order[i]] = i;
  Tensor out = index_select(sorted, from_vector(inverse, {m}).to(x.device()), Indices::trusted);
  return out;
}

}  // namespace vqddp
