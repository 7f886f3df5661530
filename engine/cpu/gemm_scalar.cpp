// The fixed-order GEMM for scalar (compiled with its own flags, engine/meson.build).
#include "engine/cpu/gemm_kernel.h"

namespace vqddp::cpu {
VQDDP_GEMM_ISA_TABLE(scalar)
}  // namespace vqddp::cpu
