#include "comm/rank_order.h"

#include <atomic>
#include <charconv>
#include <cstdlib>
#include <cstring>

#include "engine/core/error.h"

namespace vqddp {

namespace {

// The process's order: read from VQDDP_REDUCE_ORDER on first use, or set by
// set_reduce_order (tests). Packed in one word so a reader never sees half
// of an update: bit 0 descending, the rest the rotation.
std::atomic<int>& order_word() {
  static std::atomic<int> word = [] {
    const char* v = std::getenv("VQDDP_REDUCE_ORDER");
    ReduceOrder o = v ? parse_reduce_order(v) : ReduceOrder{};
    return o.rotate * 2 + (o.descending ? 1 : 0);
  }();
  return word;
}

}  // namespace

ReduceOrder parse_reduce_order(const std::string& text) {
  if (text.empty() || text == "ascending") return {};
  if (text == "descending") return {true, 0};
  if (text.rfind("rotate:", 0) == 0) {
    const char* b = text.data() + 7;
    const char* e = text.data() + text.size();
    int k = -1;
    auto [end, ec] = std::from_chars(b, e, k);
    if (ec == std::errc() && end == e && k >= 0 && k < (1 << 20)) return {false, k};
  }
  VQDDP_THROW("VQDDP_REDUCE_ORDER '{}': expected ascending, descending or rotate:K (K a rank count >= 0)",
              text);
}

ReduceOrder reduce_order() {
  int w = order_word().load(std::memory_order_relaxed);
  return {(w & 1) != 0, w / 2};
}

void set_reduce_order(ReduceOrder order) {
  order_word().store(order.rotate * 2 + (order.descending ? 1 : 0), std::memory_order_relaxed);
}

int rank_at(const ReduceOrder& order, int position, int world) {
  int r = order.descending ? world - 1 - position : position;
  return (r + order.rotate) % world;
}

}  // namespace vqddp
