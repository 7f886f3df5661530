// Counters of what a thread asked of its devices: copies between the host
// and a device, and waits of the host for a device's queue. The simulated
// device (`sim`) and the CUDA backend both count, per thread, so a rank
// thread's counts are its own. Tests read them around a training step to
// prove that a step which does not log never makes the host wait.
//
// What counts:
//   to_host   a copy device -> host (also a value a kernel returns to the
//             host: first_nonfinite, min_max_i64, sum_squares). Each one is
//             also a wait: the host needs the device's result.
//   to_device a copy host -> device (the host does not wait for the queue).
//   waits     the host waited for the device (to_host reads, synchronize).
//   launches  work queued on the device's stream, and layout_bytes the
//             bytes layout copies wrote (engine/counted_kernels.h's rule).
//   flops     the floating-point operations of the kernel-table calls the
//             thread made (engine/kernel_flops.h), on every device, the
//             CPU included: the profile's GFLOP (engine/op_profile.h).
// Copies a communicator makes to stage a collective's tensors through the
// host (the thread backend reduces in host memory) are counted apart, in
// the staged_* fields, inside a CollectiveStagingScope: they are the cost
// of that backend, not of the step's own code (NCCL has none).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vqddp {

struct DeviceCounters {
  int64_t to_host = 0, to_device = 0, waits = 0;
  int64_t to_host_bytes = 0, to_device_bytes = 0;
  int64_t staged_to_host = 0, staged_to_device = 0, staged_waits = 0;
  int64_t launches = 0, layout_bytes = 0;
  int64_t flops = 0;

  DeviceCounters operator-(const DeviceCounters& earlier) const;
  DeviceCounters operator+(const DeviceCounters& more) const;
  bool operator==(const DeviceCounters&) const = default;
  std::string str() const;  // "3 to host (120 B), 1 to device (4 B), 3 waits; staged: ..."
};

// This thread's counts since it started or since its last reset.
DeviceCounters device_counters();
void reset_device_counters();

// Called by device backends.
void count_to_host(int64_t bytes);  // a copy or returned value device -> host, and its wait
void count_to_device(int64_t bytes);
void count_wait();
// One launch: `kernel` names the kernel-table call, `sizes` (up to four)
// its shape, for a LaunchRecording.
void count_launch(const char* kernel, std::initializer_list<int64_t> sizes);
void count_layout_bytes(int64_t bytes);
// A kernel-table call's floating-point operations (engine/kernel_flops.h):
// by the backend that does the arithmetic, once per call.
void count_flops(int64_t flops);

// A launch as a LaunchRecording keeps it: which kernel, on what sizes.
struct LaunchRecord {
  const char* kernel = "";
  int64_t sizes[4] = {};
};

// While one lives on a thread, the launches that thread counts (outside a
// collective's staging) are appended to `launches`: a step's launch sequence,
// for tests and benchmarks that count launches by kernel. Not nestable.
class LaunchRecording {
 public:
  LaunchRecording();
  ~LaunchRecording();
  LaunchRecording(const LaunchRecording&) = delete;
  LaunchRecording& operator=(const LaunchRecording&) = delete;
  std::vector<LaunchRecord> launches;
};

// While one is alive on a thread, that thread's transfers and waits count
// as staging of a collective (staged_*), not as the step's own.
class CollectiveStagingScope {
 public:
  CollectiveStagingScope();
  ~CollectiveStagingScope();
  CollectiveStagingScope(const CollectiveStagingScope&) = delete;
  CollectiveStagingScope& operator=(const CollectiveStagingScope&) = delete;

 private:
  bool outer_;
};

}  // namespace vqddp
