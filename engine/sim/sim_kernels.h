// The simulated device `sim` (Device::sim): a DeviceKernels whose memory is
// allocated apart from host tensors (Tensor::data refuses it, as for a GPU)
// and whose arithmetic is the CPU's (cpu_kernels()), so a sim run gives the
// CPU's bits. Every host<->device copy, every value returned to the host and
// every synchronize is counted (engine/device_counters.h): a test that runs
// a training step on sim proves that the step never waits on the host,
// which is what makes a GPU step fast, without a GPU.
#pragma once

#include "engine/device.h"

namespace vqddp {

DeviceKernels& sim_kernels();

}  // namespace vqddp
