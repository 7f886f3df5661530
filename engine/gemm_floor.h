// The GEMM floor: the fastest a device multiplies float matrices, in
// GFLOP/s. A training step can do no better than its FLOPs
// (engine/kernel_flops.h) at this speed, so `vqddp train --profile` says
// how far its steps are from it ("x% of the GEMM floor").
// Internal header: not installed with the library (the profile's floor).
#pragma once

#include "engine/device.h"

namespace vqddp {

// Times a 16384 x 256 @ 256 x 1024 product (8.6 GFLOP, bench/fixed_gemm's
// "large" shape) through `device`'s kernel table, with the library's sgemm
// and with the fixed-order GEMM (engine/cpu/fixed_gemm.h), the best of three
// runs each after a warm-up, and returns the faster one's GFLOP/s. On the
// CPU with the engine's current thread count (cpu_threads()): call it
// before ranks share the cores out. About half a second on 2 cores.
double measure_gemm_floor(Device device);

}  // namespace vqddp
