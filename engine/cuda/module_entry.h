// Internal header: not installed.
//
// What the engine's CUDA module (libvqddp_cuda.so, engine/cuda_module.h)
// gives the library: one entry, vqddp_cuda_engine_entry, returning these.
// No CUDA header here: the library's side includes it.
#pragma once

namespace vqddp {

class DeviceKernels;

struct CudaEngineEntry {
  // Devices this process can use (0 without a driver or GPU); never throws.
  int (*device_count)();
  // The engine's kernels on cuda:device (created on first use, never
  // destroyed); throws naming the device when there is no such GPU.
  DeviceKernels* (*backend_for)(int device);
};

}  // namespace vqddp

// Every module also defines `extern "C" const char vqddp_module_build[]`,
// the vqddp version it was built for, which the loader compares with its own.
