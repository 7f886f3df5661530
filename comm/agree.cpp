#include "comm/agree.h"

#include <algorithm>
#include <cstring>

namespace vqddp {

namespace {

constexpr int64_t kMessageWords = 500;  // 4000 bytes of message

}  // namespace

void agree_outcome(Communicator& comm, const std::string& failure, bool nonfinite) {
  const int w = comm.world_size();
  // One slot per rank, 0 where that rank is fine, else 1 (2 for a
  // non-finite value): after the sum every rank knows which ranks failed
  // and how, the same on all.
  Tensor failed = zeros({w}, DType::i64);
  failed.data<int64_t>()[comm.rank()] = failure.empty() ? 0 : nonfinite ? 2 : 1;
  comm.all_reduce(failed, ReduceOp::sum);
  const int64_t* f = failed.data<int64_t>();
  int64_t count = w - std::count(f, f + w, int64_t{0});
  if (count == 0) return;
  const int root = static_cast<int>(std::find_if(f, f + w, [](int64_t v) { return v != 0; }) - f);
  Tensor text = zeros({kMessageWords}, DType::i64);
  if (comm.rank() == root)
    std::memcpy(text.raw_ptr(), failure.data(),
                std::min<size_t>(failure.size(), kMessageWords * sizeof(int64_t) - 1));
  comm.broadcast(text, root);
  std::string message(static_cast<const char*>(text.raw_ptr()));
  int64_t others = count - 1;
  std::string all = fmt::format("rank {}: {}{}", root, message,
                                others > 0 ? fmt::format(" (and {} other rank{})", others, others == 1 ? "" : "s") : "");
  if (f[root] == 2) throw AgreedNonFiniteError(all);
  throw AgreedError(all);
}

std::vector<std::vector<int64_t>> gather_values(Communicator& comm, const std::vector<int64_t>& values) {
  const int64_t n = static_cast<int64_t>(values.size());
  Tensor all = zeros({comm.world_size() * n}, DType::i64);
  comm.all_gather(from_vector(values, {n}), all);
  std::vector<std::vector<int64_t>> rows;
  const int64_t* p = all.data<int64_t>();
  for (int r = 0; r < comm.world_size(); ++r) rows.emplace_back(p + r * n, p + (r + 1) * n);
  return rows;
}

}  // namespace vqddp
