#include "vq/kernels/vq_kernels.h"

#include "vqddp_config.h"

namespace vqddp {

VqKernels& vq_kernels(Device device) {
  return device.kind == Device::Kind::cuda ? cuda_vq_kernels() : cpu_vq_kernels();
}

#if !VQDDP_HAVE_CUDA
VqKernels& cuda_vq_kernels() {
  VQDDP_THROW("the VQ kernels for CUDA are not in this build (meson -Dcuda=enabled needs the CUDA toolkit)");
}
#endif

}  // namespace vqddp
