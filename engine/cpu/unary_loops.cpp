#include "engine/cpu/unary_loops.h"

#include "engine/cpu/gemm_isa.h"

namespace vqddp {

void cpu_unary(const UnaryFn& fn, const float* x, float* out, int64_t n) {
  cpu::active_isa().unary[static_cast<int>(fn.op)](fn, x, out, n);
}

void cpu_unary_backward(const UnaryFn& fn, const float* x, const float* y, const float* g, float* out, int64_t n) {
  cpu::active_isa().unary_backward[static_cast<int>(fn.op)](fn, x, y, g, out, n);
}

void cpu_adamw(const AdamWStep& s, float* p, const float* g, float* m, float* v, int64_t n) {
  cpu::active_isa().adamw(s, p, g, m, v, n);
}

}  // namespace vqddp
