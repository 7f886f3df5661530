// Bit-for-bit equality of two tensors on any device (shape, dtype and every
// value's bits): the check of every promise the engine makes in bits.
#pragma once

#include <cstring>
#include <vector>

#include "engine/core/tensor.h"

namespace vqddp::test {

inline bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  return std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

}  // namespace vqddp::test
