// Host-side CUDA runtime pieces the engine (and vq's kernels) share: the
// calling thread's stream and cuBLAS handle per device, and the device
// guard. Only compiled in CUDA builds.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

namespace vqddp {
class DeviceKernels;
}

namespace vqddp::cuda {

// Makes `device` current for the calling thread until the guard ends.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// The calling thread's stream on `device` (non-blocking, created on first
// use, synchronised and destroyed when the thread ends). Rank threads thus
// each get their own stream without any setup.
cudaStream_t current_stream(int device);
// The calling thread's cuBLAS handle on `device`, bound to current_stream
// and to a workspace of its own (what cuBLAS needs for run-to-run
// reproducible results with several streams).
cublasHandle_t current_blas(int device);

// Devices this process can use (0 without a driver or GPU); never throws.
int device_count();
// The engine's kernels on `device` (created on first use, never destroyed).
DeviceKernels* backend_for(int device);

}  // namespace vqddp::cuda
