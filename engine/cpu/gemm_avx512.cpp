// The fixed-order GEMM for avx512 (the instruction set is enabled in gemm_kernel.h).
#define VQDDP_GEMM_ISA 512
#include "engine/cpu/gemm_kernel.h"

namespace vqddp::cpu {
VQDDP_GEMM_ISA_TABLE(avx512)
}  // namespace vqddp::cpu
