// The fixed-order GEMM for avx2 (the instruction set is enabled in gemm_kernel.h).
#define VQDDP_GEMM_ISA 256
#include "engine/cpu/gemm_kernel.h"

namespace vqddp::cpu {
VQDDP_GEMM_ISA_TABLE(avx2)
}  // namespace vqddp::cpu
