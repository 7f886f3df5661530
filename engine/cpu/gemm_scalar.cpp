// The fixed-order GEMM for scalar (the instruction set is enabled in gemm_kernel.h).
#define VQDDP_GEMM_ISA 0
#include "engine/cpu/gemm_kernel.h"

namespace vqddp::cpu {
VQDDP_GEMM_ISA_TABLE(scalar)
}  // namespace vqddp::cpu
