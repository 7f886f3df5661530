#include "engine/sim/sim_kernels.h"

#include "engine/cpu/cpu_kernels.h"
#include "engine/core/cpu_allocator.h"
#include "engine/device_counters.h"

namespace vqddp {

namespace {

// The CPU's kernels (the arithmetic, hence the CPU's bits), plus counting of
// what crosses between the host and the device and of what makes the host
// wait: only those overrides are here.
class SimKernels final : public CpuKernels {
 public:
  void copy(void* dst, bool dst_host, const void* src, bool src_host, size_t bytes) override {
    if (bytes == 0) return;  // as on a GPU: nothing moves, nothing waits
    if (dst_host && !src_host) count_to_host(static_cast<int64_t>(bytes));
    if (!dst_host && src_host) count_to_device(static_cast<int64_t>(bytes));
    CpuKernels::copy(dst, true, src, true, bytes);
  }
  void synchronize() override { count_wait(); }
  // Results the host reads back.
  int64_t first_nonfinite(const float* x, int64_t n) override {
    count_to_host(sizeof(int64_t));
    return CpuKernels::first_nonfinite(x, n);
  }
  void min_max_i64(const int64_t* x, int64_t n, int64_t* lo, int64_t* hi) override {
    count_to_host(2 * sizeof(int64_t));
    CpuKernels::min_max_i64(x, n, lo, hi);
  }
};

}  // namespace

DeviceKernels& sim_kernels() {
  static SimKernels kernels;
  return kernels;
}

}  // namespace vqddp
