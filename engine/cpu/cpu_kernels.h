// The CPU as one more DeviceKernels backend (engine/device.h): the reference
// arithmetic every other backend must match bit for bit. The engine's ops
// call a DeviceKernels for every device, the CPU included, so the path a
// GPU or the simulated device takes is the path the CPU takes, not a branch
// beside it. Pointers are host pointers; nothing is asynchronous.
#pragma once

#include "engine/device.h"

namespace vqddp {

// The one CPU backend (stateless apart from per-thread scratch).
DeviceKernels& cpu_kernels();

}  // namespace vqddp
