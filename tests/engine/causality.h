// What a causality test compares: a tensor with its future changed, and
// whether two outputs agree on everything before a position of their last
// dimension (and differ at it, so the test sees the dependence it allows).
#pragma once

#include <cstring>
#include <utility>
#include <vector>

#include "engine/core/tensor.h"

namespace vqddp::test {

// x with its last dimension's entries from `from` on replaced by other values.
inline Tensor future_changed(const Tensor& x, int64_t from) {
  std::vector<float> v = x.to_vector<float>();
  const int64_t len = x.shape().back();
  for (size_t i = 0; i < v.size(); ++i)
    if (static_cast<int64_t>(i) % len >= from) v[i] = v[i] * -3.f + 1.f;
  return from_vector(v, x.shape());
}

// Whether positions [0, upto) of the last dimension are the same bits in
// a and b, and whether position upto differs somewhere (when it exists).
inline std::pair<bool, bool> same_before(const Tensor& a, const Tensor& b, int64_t upto) {
  std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  const int64_t len = a.shape().back();
  bool same = true, differs_at = false;
  for (size_t i = 0; i < x.size(); ++i) {
    const int64_t t = static_cast<int64_t>(i) % len;
    if (t < upto) same = same && std::memcmp(&x[i], &y[i], sizeof(float)) == 0;
    if (t == upto) differs_at = differs_at || x[i] != y[i];
  }
  return {same, differs_at};
}

}  // namespace vqddp::test
