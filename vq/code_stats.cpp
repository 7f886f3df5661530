#include "vq/code_stats.h"

#include <fmt/format.h>

#include "comm/agree.h"
#include "engine/device.h"
#include "engine/kernel_math.h"
#include "vq/kernels/vq_kernels.h"

namespace vqddp {

Tensor grid_scale(const std::vector<Tensor>& xs, Communicator* comm) {
  VQDDP_ASSERT(!xs.empty(), "grid_scale: no rows");
  const Device dev = xs[0].device();
  Tensor scale = zeros({1}, DType::f64, dev);
  DeviceKernels& k = device_kernels(dev);
  for (const Tensor& x : xs) {
    VQDDP_ASSERT(x.dtype() == DType::f32 && x.device() == dev,
                 "grid_scale: rows {} on {}, expected float32 on {}", x.desc(), x.device().str(), dev.str());
    k.max_abs_finite(static_cast<const float*>(x.raw_ptr()), x.numel(), static_cast<double*>(scale.raw_ptr()));
  }
  if (comm) comm->all_reduce(scale, ReduceOp::max);
  return scale;
}

Tensor code_stats(const Tensor& x, const Tensor& indices, const StatsLayout& layout, int rank, const Tensor& grid) {
  VQDDP_ASSERT(x.dim() == 2 && indices.dim() == 1 && indices.size(0) == x.size(0) &&
                  (layout.d == 0 || x.size(1) == layout.d),
              "code_stats: x {} and indices {} do not match", x.desc(), indices.desc());
  VQDDP_ASSERT(indices.device() == x.device(), "code_stats: x on {}, indices on {}", x.device().str(),
              indices.device().str());
  VQDDP_ASSERT(rank >= 0 && rank < layout.world, "code_stats: rank {} outside a world of {}", rank, layout.world);
  int64_t n = x.size(0), k = layout.k;
  if (grid.defined()) {
    VQDDP_ASSERT(grid.dtype() == DType::f64 && grid.numel() == 1 && grid.device() == x.device(),
                 "code_stats: grid {} on {}", grid.desc(), grid.device().str());
    // 2^26 grid rows over all ranks keep every sum below 2^53 grid steps
    // (kernel_math.h). Checked per rank against its share, so each rank
    // decides without a collective.
    VQDDP_CHECK(n <= (int64_t{1} << kGridRowsLog2) / layout.world,
                "the codebook statistics take at most 2^{} rows per step over all ranks (exact sums); rank {} has "
                "{} rows of {} ranks' batch: use a smaller batch or fewer frames per example",
                kGridRowsLog2, rank, n, layout.world);
  }
  Tensor stats = zeros({layout.size()}, DType::f64, x.device());
  // Counts then sums, by code in a fixed order (the same numbers on every
  // run, no floating-point atomics); rows with no columns add counts only.
  auto* p = static_cast<double*>(stats.raw_ptr());
  device_kernels(x.device())
      .index_add_rows(static_cast<const float*>(x.raw_ptr()), static_cast<const int64_t*>(indices.raw_ptr()), n,
                      layout.d, k, p, p + k, grid.defined() ? static_cast<const double*>(grid.raw_ptr()) : nullptr);
  vq_kernels(x.device()).flag_nonfinite(x, layout, rank, stats);
  return stats;
}

std::string nonfinite_flags_message(const double* flags, int world, int64_t cols, const std::string& input) {
  std::string bad;
  for (int r = 0; r < world; ++r) {
    if (flags[r] == 0) continue;
    int64_t at = static_cast<int64_t>(flags[r]) - 1, c = std::max<int64_t>(cols, 1);
    bad += fmt::format("{}rank {}: row {} of {} has a non-finite value (in column {})",
                       bad.empty() ? "" : "; ", r, at / c, input, at % c);
  }
  return bad;
}

void check_nonfinite_flags(const Tensor& stats, const StatsLayout& layout) {
  std::vector<double> flags = stats.reshape({-1}).slice_rows(layout.flag(0), layout.size()).to_vector<double>();
  std::string bad = nonfinite_flags_message(flags.data(), layout.world, layout.cols);
  if (!bad.empty()) VQDDP_THROW_NONFINITE_EVERY_RANK("{}", bad);
}

}  // namespace vqddp
