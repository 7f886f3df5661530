// The VQ layer's device kernels, behind one dispatch: vq_kernels(device)
// gives the CPU implementation for memory the host can address (the CPU and
// the simulated device `sim`, which thereby compute the CPU's bits) and the
// CUDA one for a GPU. vq/ calls these for every device; there is no CPU
// branch beside them.
//
// The two kernel tables follow one convention (docs/devices.md, "Kernel
// tables"): a contract header (this one; engine/device.h), the per-element
// formulas both backends share (vq_math.h; engine/kernel_math.h), a folder
// per backend (cpu/cpu_vq_kernels.cpp; cuda/cuda_vq_kernels.cpp with its
// kernels cuda/vq_kernels.cu, launched through cuda/vq_launch.h), the
// simulated device on the CPU's code, and one launch counted per call on
// sim and cuda (vq_kernels.cpp; engine/counted_kernels.h). The operands
// are each layer's own: the engine's table sits below Tensor (a tensor
// allocates through it) and takes device pointers; this one sits above it
// and takes Tensors, whose shapes it checks nowhere else.
//
// No method returns a device value to the host: results land in tensors on
// the operands' device. What the host must know (metrics, a non-finite row)
// it reads with a counted copy (engine/device_counters.h) when it needs it,
// which on a training step that does not log is never.
// Internal header: not installed with the library (the VQ kernels' table, behind the quantizers).
#pragma once

#include <tuple>

#include "engine/core/tensor.h"
#include "vq/code_stats.h"

namespace vqddp {

// What the revival of dead codes draws from the shared stream (sampler.h's
// rule, for m unknown to the host): global row numbers for the expired
// codes in code order. `without_replacement` holds min(total, K) draws
// without replacement, `with_replacement` K draws with replacement (empty
// when total >= K, when it is never used); the device picks per step by
// m <= total (vq_math.h revival_row).
struct RevivalDraws {
  Tensor without_replacement;  // int64 (min(total, K)) on the device
  Tensor with_replacement;     // int64 (K) or (0) on the device
  int64_t total_rows = 0;      // rows of the global batch
  int64_t first_row = 0;       // global number of this rank's first row

  // Every field, once (engine/device.h's BroadcastPlan::fields).
  auto fields() const {
    const auto& [without_, with_, total_, first_] = *this;
    return std::tie(without_, with_, total_, first_);
  }
};

class VqKernels {
 public:
  virtual ~VqKernels() = default;

  // indices (N) int64 <- nearest codes of x (N, D) in embed (K, D), assign.h's
  // rule (fixed-order dot, ties to the lowest code). N may be 0.
  virtual void assign(const Tensor& x, const Tensor& embed, bool cosine, Tensor& indices) = 0;

  // stats[layout.flag(rank)] = 1 + the flat position of the first NaN or Inf
  // of x, or 0 (float64; exact below 2^53 elements).
  virtual void flag_nonfinite(const Tensor& x, const StatsLayout& layout, int rank, Tensor& stats) = 0;

  // EMA steps 6 and 7 (codebook.h) from all-reduced stats, in place on the
  // three float32 tensors; nothing changes when a rank flagged a non-finite
  // row (the step will throw when its metrics are read).
  virtual void ema_update(const Tensor& stats, const StatsLayout& layout, Tensor& cluster_size, Tensor& embed_avg,
                          Tensor& embed, float decay, float eps) = 0;

  // Dead-code revival, first half: block (K, D) gets, in row j, the j-th
  // expired code's drawn row if this rank holds it (x (n_r, D) are global
  // rows first_row ...), else -0.0 (so a SUM all-reduce of the ranks' blocks
  // gives every rank the drawn rows bit for bit: x + -0.0 is x, also for
  // x = -0.0). A code is expired when cluster_size < threshold (strict).
  virtual void revival_candidates(const Tensor& x, const Tensor& cluster_size, float threshold,
                                  const RevivalDraws& draws, Tensor& block) = 0;
  // Second half, on the summed block: every expired code c, the j-th, gets
  // embed[c] = block[j], embed_avg[c] = block[j] * threshold, cluster_size[c]
  // = threshold; stats[layout.revived()] = the number revived. Nothing
  // changes when a rank flagged a non-finite row in stats.
  virtual void revive(const Tensor& block, const StatsLayout& layout, float threshold, Tensor& stats,
                      Tensor& cluster_size, Tensor& embed_avg, Tensor& embed) = 0;

  // One k-means iteration's update (kmeans.h) from all-reduced stats: means
  // (K, D) = sums / counts where counts > 0 (an empty cluster keeps its
  // mean); bins (K) float32 = counts.
  virtual void kmeans_update(const Tensor& stats, const StatsLayout& layout, Tensor& means, Tensor& bins) = 0;

  // FSQ (fsq.h): rounded codes (M, D) -> indices (M), and back; half_width
  // and levels (D) float32 / int64, basis (D) int64, on the device.
  virtual void fsq_indices(const Tensor& codes, const Tensor& half_width, const Tensor& basis, Tensor& out) = 0;
  virtual void fsq_codes(const Tensor& indices, const Tensor& levels, const Tensor& half_width, const Tensor& basis,
                         Tensor& out) = 0;

  // LFQ (lfq.h): z (N, B) -> indices (N) (bit b set where z[:, b] > 0, most
  // significant first), and indices (N) -> codes (N, B) of +-scale.
  virtual void lfq_indices(const Tensor& z, Tensor& out) = 0;
  virtual void lfq_codes(const Tensor& indices, float scale, Tensor& out) = 0;
};

// The kernels for tensors on `device` (CPU code for cpu and sim).
VqKernels& vq_kernels(Device device);

// The two backends (vq_kernels picks): cpu_vq_kernels.cpp, and
// cuda_vq_kernels.cpp in the CUDA module libvqddp_cuda_vq.so, loaded on the
// first call (engine/cuda_module.h; throws saying why when it cannot be:
// no CUDA in this build, no CUDA runtime).
VqKernels& cpu_vq_kernels();
VqKernels& cuda_vq_kernels();

}  // namespace vqddp
