// The VQ kernels on a GPU (vq/kernels/cuda/vq_kernels.cu): what cpu_vq_kernels.cpp
// computes, bit for bit wherever the inputs are the same (the perplexity,
// a metric, within rounding). Scratch comes from the engine's caching
// allocator as tensors on the stream's device.
#include <algorithm>

#include "engine/cuda/launch.h"
#include "engine/cuda/runtime.h"
#include "vq/kernels/cuda/vq_launch.h"
#include "vq/kernels/vq_kernels.h"

namespace vqddp {

namespace {

template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw_ptr());
}

class CudaVqKernels final : public VqKernels {
 public:
  void assign(const Tensor& x, const Tensor& embed, bool cosine, Tensor& indices) override {
    int64_t n = x.size(0), k = embed.size(0), d = x.size(1);
    if (n == 0) return;
    int64_t tiles = cuda::assign_code_tiles(k);  // throws first if the codes exceed the kernel's grid
    Stream s(x);
    Tensor bias = empty({k}, DType::f32, x.device());
    cuda::code_bias(ptr<float>(embed), k, d, cosine, ptr<float>(bias), s.stream);
    // Rows per launch: whole 128-row tiles, at most 2^24 partial results
    // (a float score and an int64 code each: 192 MiB of scratch) whatever N
    // and K are.
    int64_t block = std::min(n, std::max<int64_t>(128, (int64_t{1} << 24) / tiles / 128 * 128));
    Tensor part_score = empty({block, tiles}, DType::f32, x.device());
    Tensor part_code = empty({block, tiles}, DType::i64, x.device());
    float factor = cosine ? 1.f : 2.f;
    for (int64_t r0 = 0; r0 < n; r0 += block)
      cuda::assign_fused(ptr<float>(x) + r0 * d, ptr<float>(embed), ptr<float>(bias), std::min(block, n - r0), k, d,
                         factor, ptr<float>(part_score), ptr<int64_t>(part_code), ptr<int64_t>(indices) + r0,
                         s.stream);
  }

  void flag_nonfinite(const Tensor& x, const StatsLayout& layout, int rank, Tensor& stats) override {
    Stream s(x);
    Tensor scratch = empty({1}, DType::i64, x.device());
    cuda::flag_nonfinite(ptr<float>(x), x.numel(), static_cast<unsigned long long*>(scratch.raw_ptr()),
                             ptr<double>(stats) + layout.flag(rank), s.stream);
  }

  void ema_update(const Tensor& stats, const StatsLayout& layout, Tensor& cluster_size, Tensor& embed_avg,
                  Tensor& embed, float decay, float eps) override {
    Stream s(embed);
    Tensor total = empty({1}, DType::f64, embed.device());
    cuda::ema_update(ptr<double>(stats), ptr<float>(cluster_size), ptr<float>(embed_avg), ptr<float>(embed), layout.k,
                     layout.d, decay, eps, ptr<double>(total), layout.world, s.stream);
  }

  void revival_candidates(const Tensor& x, const Tensor& cluster_size, float threshold, const RevivalDraws& draws,
                          Tensor& block) override {
    Stream s(block);
    int64_t k = cluster_size.numel();
    Tensor position = empty({k}, DType::i64, block.device()), count = empty({1}, DType::i64, block.device());
    const int64_t* with = draws.with_replacement.numel() ? ptr<int64_t>(draws.with_replacement) : nullptr;
    cuda::revival_candidates(ptr<float>(x), x.size(0), ptr<float>(cluster_size), k, block.size(1), threshold,
                             draws.total_rows, draws.first_row, ptr<int64_t>(draws.without_replacement), with,
                             ptr<int64_t>(position), ptr<int64_t>(count), ptr<float>(block), s.stream);
  }

  void revive(const Tensor& block, const StatsLayout& layout, float threshold, Tensor& stats, Tensor& cluster_size,
              Tensor& embed_avg, Tensor& embed) override {
    Stream s(block);
    int64_t k = cluster_size.numel();
    // The expired codes' ranks again, from the same cluster_size (the
    // all-reduce in between touched only the block): stateless, one small
    // kernel.
    Tensor position = empty({k}, DType::i64, block.device()), count = empty({1}, DType::i64, block.device());
    cuda::revive(ptr<float>(block), ptr<float>(cluster_size), k, block.size(1), threshold, ptr<int64_t>(position),
                 ptr<int64_t>(count), ptr<float>(embed_avg), ptr<float>(embed), ptr<double>(stats) + layout.revived(),
                 ptr<double>(stats) + layout.flag(0), layout.world, s.stream);
  }

  void kmeans_update(const Tensor& stats, const StatsLayout& layout, Tensor& means, Tensor& bins) override {
    Stream s(means);
    cuda::kmeans_update(ptr<double>(stats), layout.k, layout.d, ptr<float>(means), ptr<float>(bins), s.stream);
  }

  void fsq_indices(const Tensor& codes, const Tensor& half_width, const Tensor& basis, Tensor& out) override {
    Stream s(codes);
    cuda::fsq_indices(ptr<float>(codes), codes.size(0), codes.size(1), ptr<float>(half_width), ptr<int64_t>(basis),
                      ptr<int64_t>(out), s.stream);
  }

  void fsq_codes(const Tensor& indices, const Tensor& levels, const Tensor& half_width, const Tensor& basis,
                 Tensor& out) override {
    Stream s(out);
    cuda::fsq_codes(ptr<int64_t>(indices), indices.numel(), levels.numel(), ptr<int64_t>(levels),
                    ptr<float>(half_width), ptr<int64_t>(basis), ptr<float>(out), s.stream);
  }

  void lfq_indices(const Tensor& z, Tensor& out) override {
    Stream s(z);
    cuda::lfq_indices(ptr<float>(z), z.size(0), z.size(1), ptr<int64_t>(out), s.stream);
  }

  void lfq_codes(const Tensor& indices, float scale, Tensor& out) override {
    Stream s(out);
    cuda::lfq_codes(ptr<int64_t>(indices), indices.numel(), out.size(1), scale, ptr<float>(out), s.stream);
  }

 private:
  // The device of a tensor made current, and this thread's stream on it.
  struct Stream {
    explicit Stream(const Tensor& t) : guard(t.device().index), stream(cuda::current_stream(t.device().index)) {}
    cuda::DeviceGuard guard;
    cudaStream_t stream;
  };
};

}  // namespace

}  // namespace vqddp

// The module's entry (vq/kernels/vq_kernels.cpp loads it).
extern "C" __attribute__((visibility("default"))) vqddp::VqKernels* vqddp_cuda_vq_entry() {
  static vqddp::CudaVqKernels kernels;
  return &kernels;
}
