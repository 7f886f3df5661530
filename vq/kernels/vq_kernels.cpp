#include "vq/kernels/vq_kernels.h"

#include "engine/core/error.h"
#include "engine/cuda_module.h"
#include "engine/device_counters.h"
#include "engine/kernel_flops.h"
#include "engine/step_graph.h"
#include "vqddp_config.h"

namespace vqddp {

namespace {

// Launch counting for sim and cuda, by engine/counted_kernels.h's rule: one
// launch per kernel-table call that queues work (the GPU's assign and EMA
// update queue two kernels behind one call; they count one, as the engine's
// ops do). A graphed step's calls go to its step graph (engine/step_graph.h)
// with the signature of their operands, through the engine's one
// interposer (engine/step_graph.h's issue_launch).
template <class Run, class... Args>
void issue(Device device, const char* kernel, Run&& run, const Args&... args) {
  issue_launch(&device_kernels(device), kernel, std::forward<Run>(run), args...);
}

class CountedVqKernels final : public VqKernels {
 public:
  // `counts_flops` as CountedKernels' (engine/counted_kernels.h): for a
  // table that does not count its own FLOPs (CUDA's).
  CountedVqKernels(VqKernels& inner, bool counts_flops) : k_(inner), counts_flops_(counts_flops) {}
  void assign(const Tensor& x, const Tensor& embed, bool cosine, Tensor& indices) override {
    if (x.size(0) > 0) count_launch("vq.assign", {x.size(0), embed.size(0)});
    flops(kernel_flops::vq_assign(x.size(0), embed.size(0), x.size(1)));
    issue(
        x.device(), "vq.assign", [=, this]() mutable { k_.assign(x, embed, cosine, indices); }, x, embed, cosine,
        indices);
  }
  void flag_nonfinite(const Tensor& x, const StatsLayout& layout, int rank, Tensor& stats) override {
    count_launch("vq.flag_nonfinite", {});
    issue(
        x.device(), "vq.flag_nonfinite", [=, this]() mutable { k_.flag_nonfinite(x, layout, rank, stats); }, x, layout,
        rank, stats);
  }
  void ema_update(const Tensor& stats, const StatsLayout& layout, Tensor& cluster_size, Tensor& embed_avg,
                  Tensor& embed, float decay, float eps) override {
    count_launch("vq.ema_update", {});
    flops(kernel_flops::vq_ema_update(layout.k, layout.d));
    issue(
        stats.device(), "vq.ema_update",
        [=, this]() mutable { k_.ema_update(stats, layout, cluster_size, embed_avg, embed, decay, eps); }, stats,
        layout, cluster_size, embed_avg, embed, decay, eps);
  }
  void revival_candidates(const Tensor& x, const Tensor& cluster_size, float threshold, const RevivalDraws& draws,
                          Tensor& block) override {
    count_launch("vq.revival_candidates", {});
    issue(
        x.device(), "vq.revival_candidates",
        [=, this]() mutable { k_.revival_candidates(x, cluster_size, threshold, draws, block); }, x, cluster_size,
        threshold, draws, block);
  }
  void revive(const Tensor& block, const StatsLayout& layout, float threshold, Tensor& stats, Tensor& cluster_size,
              Tensor& embed_avg, Tensor& embed) override {
    count_launch("vq.revive", {});
    issue(
        block.device(), "vq.revive",
        [=, this]() mutable { k_.revive(block, layout, threshold, stats, cluster_size, embed_avg, embed); }, block,
        layout, threshold, stats, cluster_size, embed_avg, embed);
  }
  void kmeans_update(const Tensor& stats, const StatsLayout& layout, Tensor& means, Tensor& bins) override {
    count_launch("vq.kmeans_update", {});
    flops(kernel_flops::vq_kmeans_update(layout.k, layout.d));
    issue(
        stats.device(), "vq.kmeans_update", [=, this]() mutable { k_.kmeans_update(stats, layout, means, bins); },
        stats, layout, means, bins);
  }
  void fsq_indices(const Tensor& codes, const Tensor& half_width, const Tensor& basis, Tensor& out) override {
    if (codes.numel() > 0) count_launch("vq.fsq_indices", {});
    flops(kernel_flops::vq_scalar_codes(codes.numel()));
    issue(
        codes.device(), "vq.fsq_indices", [=, this]() mutable { k_.fsq_indices(codes, half_width, basis, out); }, codes,
        half_width, basis, out);
  }
  void fsq_codes(const Tensor& indices, const Tensor& levels, const Tensor& half_width, const Tensor& basis,
                 Tensor& out) override {
    if (indices.numel() > 0) count_launch("vq.fsq_codes", {});
    flops(kernel_flops::vq_scalar_codes(indices.numel() * levels.numel()));
    issue(
        indices.device(), "vq.fsq_codes",
        [=, this]() mutable { k_.fsq_codes(indices, levels, half_width, basis, out); }, indices, levels, half_width,
        basis, out);
  }
  void lfq_indices(const Tensor& z, Tensor& out) override {
    if (z.numel() > 0) count_launch("vq.lfq_indices", {});
    flops(kernel_flops::vq_scalar_codes(z.numel()));
    issue(
        z.device(), "vq.lfq_indices", [=, this]() mutable { k_.lfq_indices(z, out); }, z, out);
  }
  void lfq_codes(const Tensor& indices, float scale, Tensor& out) override {
    if (indices.numel() > 0) count_launch("vq.lfq_codes", {});
    flops(kernel_flops::vq_scalar_codes(out.numel()));
    issue(
        indices.device(), "vq.lfq_codes", [=, this]() mutable { k_.lfq_codes(indices, scale, out); }, indices, scale,
        out);
  }

 private:
  void flops(int64_t n) const {
    if (counts_flops_) count_flops(n);
  }
  VqKernels& k_;
  bool counts_flops_;
};

}  // namespace

VqKernels& vq_kernels(Device device) {
  if (device.kind == Device::Kind::cuda) {
    static CountedVqKernels counted(cuda_vq_kernels(), true);
    return counted;
  }
  if (device.kind == Device::Kind::sim) {
    static CountedVqKernels counted(cpu_vq_kernels(), false);  // the CPU's table counts its FLOPs
    return counted;
  }
  return cpu_vq_kernels();
}

VqKernels& cuda_vq_kernels() {
  static std::string why;
  static VqKernels* kernels = cuda_module_call<VqKernels>("cuda_vq", "vqddp_cuda_vq_entry", why);
  VQDDP_CHECK(kernels, "the VQ kernels for CUDA are not available: {}", why);
  return *kernels;
}

}  // namespace vqddp
