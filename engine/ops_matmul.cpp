// matmul with transpose flags: the only GEMM entry point of the engine.
//
// The forward product is batch-invariant (fixed_gemm.h: one fma chain per
// element, on the CPU and in the CUDA kernel alike); the backward products
// go to OpenBLAS/cuBLAS, whose speed they keep: a gradient is a sum over
// the batch, so its bits depend on the split over ranks whatever we do.
#include "engine/autograd.h"
#include "engine/device_plans.h"
#include "engine/ops.h"

namespace vqddp {

namespace {

enum class Gemm { fixed_order, library };

Tensor matmul_with(Gemm kind, const Tensor& a, const Tensor& b, bool ta, bool tb) {
  VQDDP_CHECK(a.dtype() == DType::f32 && b.dtype() == DType::f32, "matmul: expected float32, got {} and {}",
              a.desc(), b.desc());
  VQDDP_CHECK(a.dim() == 2 && b.dim() == 2, "matmul: expected 2-D operands, got {} and {}", a.desc(), b.desc());
  int64_t m = ta ? a.size(1) : a.size(0), k = ta ? a.size(0) : a.size(1);
  int64_t kb = tb ? b.size(1) : b.size(0), n = tb ? b.size(0) : b.size(1);
  VQDDP_CHECK(k == kb, "matmul: inner dimensions differ: op(a) is [{}, {}], op(b) is [{}, {}] (a {}, b {}{}{})", m, k,
              kb, n, shape_str(a.shape()), shape_str(b.shape()), ta ? ", a transposed" : "", tb ? ", b transposed" : "");
  DeviceKernels& dk = device_of("matmul", {&a, &b});
  // GEMM with beta = 0 writes every element without reading it: no fill.
  Tensor out = empty({m, n}, DType::f32, a.device());
  // Empty operands: the result is zeros (BLAS rejects zero leading dims).
  if (k == 0) out.fill_(0);
  if (m > 0 && n > 0 && k > 0) {
    auto* pa = static_cast<const float*>(a.raw_ptr());
    auto* pb = static_cast<const float*>(b.raw_ptr());
    auto* pc = static_cast<float*>(out.raw_ptr());
    if (kind == Gemm::fixed_order)
      dk.gemm_fixed(ta, tb, m, n, k, pa, a.size(1), pb, b.size(1), pc, n);
    else
      dk.gemm(ta, tb, m, n, k, 1.f, pa, a.size(1), pb, b.size(1), 0.f, pc, n);
  }
  Tensor da = a.detach(), db = b.detach();
  bool need_a = a.requires_grad(), need_b = b.requires_grad();
  return record_op("matmul", out, {a, b}, {a, b}, [=](const Tensor& g) -> std::vector<Tensor> {
    // C = op(A) op(B):  dA = g op(B)^T (or its transpose), dB = op(A)^T g (or its transpose).
    Tensor ga, gb;
    const Gemm lib = Gemm::library;
    if (need_a) ga = ta ? matmul_with(lib, db, g, tb, true) : matmul_with(lib, g, db, false, !tb);
    if (need_b) gb = tb ? matmul_with(lib, g, da, true, ta) : matmul_with(lib, da, g, !ta, false);
    return {ga, gb};
  });
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) { return matmul_with(Gemm::fixed_order, a, b, ta, tb); }

}  // namespace vqddp
