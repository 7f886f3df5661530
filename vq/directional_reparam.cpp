#include "vq/directional_reparam.h"

#include <cmath>
#include <vector>

#include "engine/core/error.h"
#include "engine/ops.h"

namespace vqddp {

Tensor directional_reparam(const Tensor& src, const Tensor& tgt, float variance, int64_t first_row,
                           const Generator& step_stream) {
  VQDDP_CHECK(src.dim() == 2 && src.shape() == tgt.shape(), "directional_reparam: rows {} and codes {} differ",
              src.desc(), tgt.desc());
  VQDDP_CHECK(variance >= 0, "directional_reparam: variance {} must not be negative", variance);
  const int64_t n = src.size(0), d = src.size(1);
  std::vector<float> noise(static_cast<size_t>(n * d));
  for (int64_t i = 0; i < n; ++i) {
    Generator g = step_stream;
    g.advance(2 * static_cast<uint64_t>(first_row + i) * static_cast<uint64_t>(d));
    for (int64_t j = 0; j < d; ++j) noise[i * d + j] = g.normal();
  }
  Tensor error = sub(tgt, src);                                                     // (N, D)
  // (N, 1), |q - x|; the squared norm clamped at 1e-24 so a row on its code
  // gets a zero gradient instead of 0 * inf.
  Tensor norm = sqrt(clamp(sum(square(error), 1, true), 1e-24f, 3.4e38f));
  Tensor noised = add(error.detach(), mul(from_vector(noise, {n, d}).to(src.device()), std::sqrt(variance)));
  Tensor unit = l2_normalize_rows(noised).detach();
  return add(src, mul(unit, norm));
}

}  // namespace vqddp
