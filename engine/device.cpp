#include "engine/device.h"

#include "engine/cpu/cpu_kernels.h"
#include "engine/error.h"
#include "engine/sim/sim_kernels.h"
#include "vqddp_config.h"

#if VQDDP_HAVE_CUDA
#include "engine/cuda/runtime.h"
#endif

namespace vqddp {

bool cuda_built() { return VQDDP_HAVE_CUDA; }

int cuda_device_count() {
#if VQDDP_HAVE_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

DeviceKernels& device_kernels(Device device) {
  if (device.kind == Device::Kind::sim) return sim_kernels();
  if (device.is_cpu()) return cpu_kernels();
#if VQDDP_HAVE_CUDA
  return *cuda::backend_for(device.index);
#else
  VQDDP_THROW("device {} is not available: this vqddp was built without CUDA (meson -Dcuda=enabled needs the CUDA "
              "toolkit at build time)", device.str());
#endif
}

}  // namespace vqddp
