#include "vq/device_vq.h"

#include <algorithm>

#include "vqddp_config.h"

#if VQDDP_HAVE_CUDA
#include "engine/cuda/launch.h"
#include "engine/cuda/runtime.h"
#include "vq/cuda/vq_launch.h"
#endif

namespace vqddp {

#if VQDDP_HAVE_CUDA

namespace {
const float* f32(const Tensor& t) { return static_cast<const float*>(t.raw_ptr()); }
float* f32w(const Tensor& t) { return static_cast<float*>(t.raw_ptr()); }
}  // namespace

Tensor assign_codes_device(const Tensor& x, const Tensor& embed, bool cosine) {
  VQDDP_CHECK(x.device() == embed.device(), "assign_codes: x is on {}, the codebook on {}", x.device().str(),
              embed.device().str());
  int64_t n = x.size(0), k = embed.size(0), d = x.size(1);
  Tensor indices = empty({n}, DType::i64, x.device());
  if (n == 0) return indices;
  int64_t tiles = cuda::assign_code_tiles(k);  // throws first if the codes exceed the kernel's grid
  int dev = x.device().index;
  cuda::DeviceGuard guard(dev);
  cudaStream_t s = cuda::current_stream(dev);
  Tensor bias = empty({k}, DType::f32, x.device());
  cuda::code_bias(f32(embed), k, d, cosine, f32w(bias), s);
  // Rows per launch: whole 128-row tiles, at most 2^24 partial results
  // (a float score and an int64 code each: 192 MiB of scratch) whatever N
  // and K are.
  int64_t block = std::min(n, std::max<int64_t>(128, (int64_t{1} << 24) / tiles / 128 * 128));
  Tensor part_score = empty({block, tiles}, DType::f32, x.device());
  Tensor part_code = empty({block, tiles}, DType::i64, x.device());
  float factor = cosine ? 1.f : 2.f;
  auto* out = static_cast<int64_t*>(indices.raw_ptr());
  for (int64_t r0 = 0; r0 < n; r0 += block)
    cuda::assign_fused(f32(x) + r0 * d, f32(embed), f32(bias), std::min(block, n - r0), k, d, factor,
                       f32w(part_score), static_cast<int64_t*>(part_code.raw_ptr()), out + r0, s);
  return indices;
}

void ema_update_device(const Tensor& stats, Tensor& cluster_size, Tensor& embed_avg, Tensor& embed, float decay,
                       float eps) {
  int dev = embed.device().index;
  cuda::DeviceGuard guard(dev);
  Tensor total = empty({1}, DType::f64, embed.device());
  cuda::ema_update(static_cast<const double*>(stats.raw_ptr()), f32w(cluster_size), f32w(embed_avg), f32w(embed),
                   embed.size(0), embed.size(1), decay, eps, static_cast<double*>(total.raw_ptr()),
                   cuda::current_stream(dev));
}

#else

Tensor assign_codes_device(const Tensor& x, const Tensor&, bool) {
  VQDDP_THROW("assign_codes: {} is not supported by this build (no CUDA)", x.desc());
}

void ema_update_device(const Tensor&, Tensor&, Tensor&, Tensor& embed, float, float) {
  VQDDP_THROW("codebook EMA update: {} is not supported by this build (no CUDA)", embed.desc());
}

#endif

}  // namespace vqddp
