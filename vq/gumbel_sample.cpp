#include "vq/gumbel_sample.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/core/error.h"
#include "engine/cpu/fixed_gemm.h"

namespace vqddp {

namespace {

float clamped_log(float t) { return std::log(std::max(t, 1e-20f)); }

// |row|^2 as one fma chain over the row, ascending: the row's alone.
float squared_norm(const float* row, int64_t d) {
  float acc = 0.f;
  for (int64_t p = 0; p < d; ++p) acc = std::fma(row[p], row[p], acc);
  return acc;
}

}  // namespace

Tensor gumbel_sample_codes(const Tensor& x_in, const Tensor& codes_in, bool cosine, float temperature,
                           int64_t first_row, const Generator& step_stream) {
  VQDDP_CHECK(temperature > 0, "gumbel_sample_codes: temperature {} must be positive", temperature);
  const Tensor x = x_in.to(Device::cpu()), codes = codes_in.to(Device::cpu());
  const int64_t n = x.size(0), d = x.size(1), k = codes.size(0);
  std::vector<float> dots(static_cast<size_t>(n * k));
  if (n > 0) fixed_gemm(false, true, n, k, d, x.data<float>(), d, codes.data<float>(), d, dots.data(), k);
  std::vector<float> code_sq(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) code_sq[j] = squared_norm(codes.data<float>() + j * d, d);
  Tensor out = empty({n}, DType::i64);
  int64_t* idx = out.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const float x_sq = cosine ? 0.f : squared_norm(x.data<float>() + i * d, d);
    Generator noise = step_stream;
    noise.advance(static_cast<uint64_t>(first_row + i) * static_cast<uint64_t>(k));
    int64_t best = 0;
    float best_score = -INFINITY;
    for (int64_t j = 0; j < k; ++j) {
      const float dot = dots[i * k + j];
      const float logit = cosine ? dot : -std::sqrt(std::max(x_sq + code_sq[j] - 2.f * dot, 1e-8f));
      const float score = logit / temperature - clamped_log(-clamped_log(noise.uniform()));
      if (score > best_score) best_score = score, best = j;  // ties: the lowest j; NaN never chosen
    }
    idx[i] = best;
  }
  return out.to(x_in.device());
}

}  // namespace vqddp
