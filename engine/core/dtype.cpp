#include "engine/core/dtype.h"

#include <fmt/format.h>

#include "engine/core/error.h"

namespace vqddp {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::i64: return 8;
    case DType::f64: return 8;
  }
  VQDDP_THROW("unknown dtype {}", static_cast<int>(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::i64: return "int64";
    case DType::f64: return "float64";
  }
  return "?";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    VQDDP_CHECK(d >= 0, "negative dimension in shape {}", shape_str(s));
    // A shape read from a file must not wrap around into a small size.
    VQDDP_CHECK(!__builtin_mul_overflow(n, d, &n), "shape {} has more elements than int64 holds", shape_str(s));
  }
  return n;
}

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

}  // namespace vqddp
