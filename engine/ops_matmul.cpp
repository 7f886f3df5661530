// matmul with transpose flags: the only GEMM entry point of the engine.
#include "engine/autograd.h"
#include "engine/blas.h"
#include "engine/device_plans.h"
#include "engine/ops.h"

namespace vqddp {

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  VQDDP_CHECK(a.dtype() == DType::f32 && b.dtype() == DType::f32, "matmul: expected float32, got {} and {}",
              a.desc(), b.desc());
  VQDDP_CHECK(a.dim() == 2 && b.dim() == 2, "matmul: expected 2-D operands, got {} and {}", a.desc(), b.desc());
  int64_t m = ta ? a.size(1) : a.size(0), k = ta ? a.size(0) : a.size(1);
  int64_t kb = tb ? b.size(1) : b.size(0), n = tb ? b.size(0) : b.size(1);
  VQDDP_CHECK(k == kb, "matmul: inner dimensions differ: op(a) is [{}, {}], op(b) is [{}, {}] (a {}, b {}{}{})", m, k,
              kb, n, shape_str(a.shape()), shape_str(b.shape()), ta ? ", a transposed" : "", tb ? ", b transposed" : "");
  DeviceKernels* dk = device_of("matmul", {&a, &b});
  // GEMM with beta = 0 writes every element without reading it: no fill.
  Tensor out = empty({m, n}, DType::f32, a.device());
  // Empty operands: the result is zeros (BLAS rejects zero leading dims).
  if (k == 0) out.fill_(0);
  if (m > 0 && n > 0 && k > 0) {
    if (dk)  // GPU: cuBLAS
      dk->gemm(ta, tb, m, n, k, 1.f, static_cast<const float*>(a.raw_ptr()), a.size(1),
               static_cast<const float*>(b.raw_ptr()), b.size(1), 0.f, static_cast<float*>(out.raw_ptr()), n);
    else
      blas_sgemm(ta, tb, m, n, k, 1.f, a.data<float>(), a.size(1), b.data<float>(), b.size(1), 0.f,
                 out.data<float>(), n);
  }
  Tensor da = a.detach(), db = b.detach();
  bool need_a = a.requires_grad(), need_b = b.requires_grad();
  return record_op("matmul", out, {a, b}, {a, b}, [=](const Tensor& g) -> std::vector<Tensor> {
    // C = op(A) op(B):  dA = g op(B)^T (or its transpose), dB = op(A)^T g (or its transpose).
    Tensor ga, gb;
    if (need_a) ga = ta ? matmul(db, g, tb, true) : matmul(g, db, false, !tb);
    if (need_b) gb = tb ? matmul(g, da, true, ta) : matmul(da, g, !ta, false);
    return {ga, gb};
  });
}

}  // namespace vqddp
