// The elementwise unary ops and the AdamW update on the CPU: kernel_math.h's
// formulas in loops compiled per instruction set (gemm_isa.h), on the set in use.
// Internal header: not installed with the library (the CPU kernels' unary loops).
#pragma once

#include <cstdint>

namespace vqddp {

struct UnaryFn;    // engine/kernel_math.h
struct AdamWStep;  // engine/kernel_math.h

// out[i] = fn.f(x[i]), and out[i] = g[i] * fn.df(x[i], y[i]) (kernel_math.h's
// UnaryFn formulas) on the widest instruction set in use: the same bits as
// the formulas themselves.
void cpu_unary(const UnaryFn& fn, const float* x, float* out, int64_t n);
void cpu_unary_backward(const UnaryFn& fn, const float* x, const float* y, const float* g, float* out, int64_t n);

// kernel_math.h's adamw_update over n elements of one tensor (p, g, m and v
// distinct arrays) on the widest instruction set in use: the same bits.
void cpu_adamw(const AdamWStep& s, float* p, const float* g, float* m, float* v, int64_t n);

}  // namespace vqddp
