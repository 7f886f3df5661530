// The VQ kernels for memory the host can address: the CPU, and the
// simulated device (whose arithmetic is the CPU's by definition). The
// reference the CUDA kernels (vq/kernels/cuda/vq_kernels.cu) match bit for bit; the
// shared formulas are in vq_math.h.
#include <cmath>
#include <vector>

#include "engine/cpu/fixed_gemm_argmin.h"
#include "engine/device_counters.h"
#include "engine/kernel_flops.h"
#include "vq/kernels/vq_kernels.h"
#include "vq/kernels/vq_math.h"

namespace vqddp {

namespace {

template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw_ptr());
}

// True when some rank flagged a non-finite row in all-reduced stats.
bool any_flag(const Tensor& stats, const StatsLayout& layout) {
  const double* f = ptr<double>(stats) + layout.flag(0);
  for (int r = 0; r < layout.world; ++r)
    if (f[r] != 0) return true;
  return false;
}

class CpuVqKernels final : public VqKernels {
 public:
  void assign(const Tensor& x, const Tensor& embed, bool cosine, Tensor& indices) override {
    int64_t n = x.size(0), k = embed.size(0), d = x.size(1);
    count_flops(kernel_flops::vq_assign(n, k, d));
    const float* pe = ptr<float>(embed);
    // Per-code bias: |e_k|^2 for Euclidean (score = bias - 2 x.e, minimised);
    // cosine maximises x.e, i.e. minimises 0 - x.e, the same loop with bias 0
    // and factor 1.
    std::vector<float> bias(k, 0.f);
    if (!cosine)
      for (int64_t j = 0; j < k; ++j) bias[j] = code_bias(pe + j * d, d);
    if (n > 0) fixed_gemm_argmin(n, d, k, ptr<float>(x), pe, bias.data(), cosine ? 1.f : 2.f, ptr<int64_t>(indices));
  }

  void flag_nonfinite(const Tensor& x, const StatsLayout& layout, int rank, Tensor& stats) override {
    const float* px = ptr<float>(x);
    int64_t n = x.numel();
    double flag = 0;
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(px[i])) {
        flag = static_cast<double>(i + 1);
        break;
      }
    ptr<double>(stats)[layout.flag(rank)] = flag;
  }

  void ema_update(const Tensor& stats, const StatsLayout& layout, Tensor& cluster_size, Tensor& embed_avg,
                  Tensor& embed, float decay, float eps) override {
    count_flops(kernel_flops::vq_ema_update(layout.k, layout.d));
    if (any_flag(stats, layout)) return;
    int64_t k = layout.k, d = layout.d;
    const double* counts = ptr<double>(stats);
    const double* sums = counts + layout.sums();
    float *cs = ptr<float>(cluster_size), *avg = ptr<float>(embed_avg), *e = ptr<float>(embed);
    const float keep = 1.f - decay;
    for (int64_t c = 0; c < k; ++c) cs[c] = ema_mix(decay, keep, cs[c], counts[c]);
    for (int64_t i = 0; i < k * d; ++i) avg[i] = ema_mix(decay, keep, avg[i], sums[i]);
    // Laplace smoothing: cs~ = (cs + eps) / (n + K eps) * n, so a code with no
    // mass is divided by a small positive number, never by zero. No mass at
    // all (zeros-initialised sizes, nothing seen yet): embed stays as it is.
    double n = 0;
    for (int64_t c = 0; c < k; ++c) n += cs[c];
    if (!(n > 0)) return;
    double denom = n + static_cast<double>(k) * static_cast<double>(eps);
    for (int64_t c = 0; c < k; ++c) {
      float smoothed = smoothed_size(cs[c], eps, n, denom);
      for (int64_t j = 0; j < d; ++j) e[c * d + j] = avg[c * d + j] / smoothed;
    }
  }

  void revival_candidates(const Tensor& x, const Tensor& cluster_size, float threshold, const RevivalDraws& draws,
                          Tensor& block) override {
    int64_t k = cluster_size.numel(), d = block.size(1), mine = x.size(0);
    const float* cs = ptr<float>(cluster_size);
    int64_t expired = 0;
    for (int64_t c = 0; c < k; ++c) expired += cs[c] < threshold;
    const int64_t* without = ptr<int64_t>(draws.without_replacement);
    const int64_t* with = draws.with_replacement.numel() ? ptr<int64_t>(draws.with_replacement) : nullptr;
    const float* px = ptr<float>(x);
    float* out = ptr<float>(block);
    for (int64_t j = 0; j < k; ++j) {
      int64_t local = j < expired ? revival_row(j, expired, draws.total_rows, without, with) - draws.first_row : -1;
      bool held = local >= 0 && local < mine;
      for (int64_t c = 0; c < d; ++c) out[j * d + c] = held ? px[local * d + c] : -0.f;
    }
  }

  void revive(const Tensor& block, const StatsLayout& layout, float threshold, Tensor& stats, Tensor& cluster_size,
              Tensor& embed_avg, Tensor& embed) override {
    if (any_flag(stats, layout)) return;
    int64_t k = cluster_size.numel(), d = block.size(1);
    float *cs = ptr<float>(cluster_size), *avg = ptr<float>(embed_avg), *e = ptr<float>(embed);
    const float* rows = ptr<float>(block);
    int64_t j = 0;
    for (int64_t c = 0; c < k; ++c) {
      if (!(cs[c] < threshold)) continue;  // strict, on state identical across ranks
      for (int64_t i = 0; i < d; ++i) {
        e[c * d + i] = rows[j * d + i];
        avg[c * d + i] = rows[j * d + i] * threshold;
      }
      cs[c] = threshold;
      ++j;
    }
    ptr<double>(stats)[layout.revived()] = static_cast<double>(j);
  }

  void kmeans_update(const Tensor& stats, const StatsLayout& layout, Tensor& means, Tensor& bins) override {
    int64_t k = layout.k, d = layout.d;
    count_flops(kernel_flops::vq_kmeans_update(k, d));
    const double* counts = ptr<double>(stats);
    const double* sums = counts + layout.sums();
    float* pm = ptr<float>(means);
    float* pb = ptr<float>(bins);
    for (int64_t c = 0; c < k; ++c) {
      pb[c] = static_cast<float>(counts[c]);
      if (counts[c] == 0) continue;  // an empty cluster keeps its mean
      for (int64_t j = 0; j < d; ++j) pm[c * d + j] = static_cast<float>(sums[c * d + j] / counts[c]);
    }
  }

  void fsq_indices(const Tensor& codes, const Tensor& half_width, const Tensor& basis, Tensor& out) override {
    count_flops(kernel_flops::vq_scalar_codes(codes.numel()));
    int64_t m = codes.size(0), d = codes.size(1);
    const float *pc = ptr<float>(codes), *hw = ptr<float>(half_width);
    const int64_t* b = ptr<int64_t>(basis);
    int64_t* po = ptr<int64_t>(out);
    for (int64_t i = 0; i < m; ++i) {
      int64_t idx = 0;
      for (int64_t j = 0; j < d; ++j) idx += fsq_digit(pc[i * d + j], hw[j]) * b[j];
      po[i] = idx;
    }
  }

  void fsq_codes(const Tensor& indices, const Tensor& levels, const Tensor& half_width, const Tensor& basis,
                 Tensor& out) override {
    int64_t m = indices.numel(), d = levels.numel();
    count_flops(kernel_flops::vq_scalar_codes(m * d));
    const int64_t *pi = ptr<int64_t>(indices), *lv = ptr<int64_t>(levels), *b = ptr<int64_t>(basis);
    const float* hw = ptr<float>(half_width);
    float* po = ptr<float>(out);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < d; ++j) po[i * d + j] = fsq_value((pi[i] / b[j]) % lv[j], hw[j]);
  }

  void lfq_indices(const Tensor& z, Tensor& out) override {
    count_flops(kernel_flops::vq_scalar_codes(z.numel()));
    int64_t n = z.size(0), bits = z.size(1);
    const float* pz = ptr<float>(z);
    int64_t* po = ptr<int64_t>(out);
    for (int64_t i = 0; i < n; ++i) {
      int64_t v = 0;
      for (int64_t b = 0; b < bits; ++b) v = v << 1 | (pz[i * bits + b] > 0.f ? 1 : 0);
      po[i] = v;
    }
  }

  void lfq_codes(const Tensor& indices, float scale, Tensor& out) override {
    count_flops(kernel_flops::vq_scalar_codes(out.numel()));
    int64_t n = indices.numel(), bits = out.size(1);
    const int64_t* pi = ptr<int64_t>(indices);
    float* po = ptr<float>(out);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t b = 0; b < bits; ++b) po[i * bits + b] = lfq_value(pi[i], bits, b, scale);
  }
};

}  // namespace

VqKernels& cpu_vq_kernels() {
  static CpuVqKernels kernels;
  return kernels;
}

}  // namespace vqddp
