// The fixed-order GEMM for avx2 (compiled with its own flags, engine/meson.build).
#include "engine/cpu/gemm_kernel.h"

namespace vqddp::cpu {
VQDDP_GEMM_ISA_TABLE(avx2)
}  // namespace vqddp::cpu
