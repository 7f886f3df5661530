// matmul with transpose flags: the only GEMM entry point of the engine.
//
// The forward product is batch-invariant (engine/cpu/fixed_gemm.h: one fma chain per
// element, on the CPU and in the CUDA kernel alike). The backward products:
// - in an exact step (exact_batch.h), the fixed-order GEMM as well: a
//   batched operand's gradient row by row, and a batch-free operand's (a
//   weight's) as one partial per unit, reduced over the ranks by the step;
// - otherwise OpenBLAS/cuBLAS, for their speed (the gradient of a weight is
//   then a sum over the batch whose bits depend on the split).
#include "engine/autograd.h"
#include "engine/device_plans.h"
#include "engine/exact_batch.h"
#include "engine/matmul_grads.h"
#include "engine/precision.h"
#include "engine/ops.h"

namespace vqddp {

namespace {

enum class Gemm { fixed_order, library };

// Unit partials into `out` [units, per_unit] by runs of consecutive units
// with the same number of rows: one batched fixed-order product per run
// (GemmBatch, one launch where the units are equal, as an exact step's
// examples are), zeros for units without rows. product(lo, rows, count, c)
// computes `count` units from global row `lo`, `rows` each, into c.
template <class Product>
void unit_products(const std::vector<int64_t>& bounds, Tensor& out, int64_t per_unit, Product&& product) {
  const int64_t units = static_cast<int64_t>(bounds.size()) - 1;
  if (per_unit == 0) return;
  for (int64_t u0 = 0, u1; u0 < units; u0 = u1) {
    const int64_t rows = bounds[u0 + 1] - bounds[u0];
    for (u1 = u0 + 1; u1 < units && bounds[u1 + 1] - bounds[u1] == rows; ++u1) {
    }
    if (rows == 0) {
      out.slice_rows(u0, u1).fill_(0);
      continue;
    }
    product(bounds[u0], rows, u1 - u0, static_cast<float*>(out.raw_ptr()) + u0 * per_unit);
  }
}

// Unit partials [units, ...B's shape] of dB for a batch-free B and a batched
// A whose rows are C's rows (ta false): unit u's rows [lo, hi) of A and g
// give dB_u = A_u^T g_u (B [k, n]) or g_u^T A_u (B [n, k], tb).
Tensor unit_partials_of_b(const Tensor& a, const Tensor& b, const Tensor& g, bool ta, bool tb) {
  VQDDP_CHECK(!ta, "matmul: a batch-free right operand {} with a transposed batched left operand {} is not supported "
              "in an exact step", b.desc(), a.desc());
  std::vector<int64_t> bounds = unit_row_bounds(a, "matmul");
  int64_t k = a.size(1), n = g.size(1), units = static_cast<int64_t>(bounds.size()) - 1;
  Tensor out = empty({units, b.numel()}, DType::f32, g.device());
  DeviceKernels& dk = device_of("matmul backward", {&a, &g});
  auto* pa = static_cast<const float*>(a.raw_ptr());
  auto* pg = static_cast<const float*>(g.raw_ptr());
  unit_products(bounds, out, b.numel(), [&](int64_t lo, int64_t rows, int64_t count, float* c) {
    if (tb)
      dk.gemm_fixed(true, false, n, k, rows, pg + lo * n, n, pa + lo * k, k, c, k, {count, rows * n, rows * k, n * k});
    else
      dk.gemm_fixed(true, false, k, n, rows, pa + lo * k, k, pg + lo * n, n, c, n, {count, rows * k, rows * n, k * n});
  });
  Shape shape{units};
  shape.insert(shape.end(), b.shape().begin(), b.shape().end());
  return out.reshape(shape);
}

// The mirror case: a batch-free A and a batched B whose rows are C's
// columns (tb): unit u's rows [lo, hi) of B and columns of g give
// dA_u = g_u B_u (A [m, k]) or B_u^T g_u^T (A [k, m], ta).
Tensor unit_partials_of_a(const Tensor& a, const Tensor& b, const Tensor& g, bool ta, bool tb) {
  VQDDP_CHECK(tb, "matmul: a batch-free left operand {} with a batched right operand {} that is not transposed is "
              "not supported in an exact step", a.desc(), b.desc());
  std::vector<int64_t> bounds = unit_row_bounds(b, "matmul");
  int64_t k = b.size(1), m = g.size(0), n = g.size(1), units = static_cast<int64_t>(bounds.size()) - 1;
  Tensor out = empty({units, a.numel()}, DType::f32, g.device());
  DeviceKernels& dk = device_of("matmul backward", {&b, &g});
  auto* pb = static_cast<const float*>(b.raw_ptr());
  auto* pg = static_cast<const float*>(g.raw_ptr());
  unit_products(bounds, out, a.numel(), [&](int64_t lo, int64_t rows, int64_t count, float* c) {
    if (ta)
      dk.gemm_fixed(true, true, k, m, rows, pb + lo * k, k, pg + lo, n, c, m, {count, rows * k, rows, k * m});
    else
      dk.gemm_fixed(false, false, m, k, rows, pg + lo, n, pb + lo * k, k, c, k, {count, rows, rows * k, m * k});
  });
  Shape shape{units};
  shape.insert(shape.end(), a.shape().begin(), a.shape().end());
  return out.reshape(shape);
}

// `rounded`: a and b are already in the run's precision (matmul_grads'
// operands); else they are rounded here (engine/precision.h).
Tensor matmul_with(Gemm kind, const Tensor& a, const Tensor& b, bool ta, bool tb, bool rounded) {
  VQDDP_CHECK(a.dtype() == DType::f32 && b.dtype() == DType::f32, "matmul: expected float32, got {} and {}",
              a.desc(), b.desc());
  VQDDP_CHECK(a.dim() == 2 && b.dim() == 2, "matmul: expected 2-D operands, got {} and {}", a.desc(), b.desc());
  int64_t m = ta ? a.size(1) : a.size(0), k = ta ? a.size(0) : a.size(1);
  int64_t kb = tb ? b.size(1) : b.size(0), n = tb ? b.size(0) : b.size(1);
  VQDDP_CHECK(k == kb, "matmul: inner dimensions differ: op(a) is [{}, {}], op(b) is [{}, {}] (a {}, b {}{}{})", m, k,
              kb, n, shape_str(a.shape()), shape_str(b.shape()), ta ? ", a transposed" : "", tb ? ", b transposed" : "");
  DeviceKernels& dk = device_of("matmul", {&a, &b});
  // The product's inputs in the run's precision; the node's edges stay on
  // a and b.
  const Tensor ra = rounded ? a : product_input(a), rb = rounded ? b : product_input(b);
  // GEMM with beta = 0 writes every element without reading it: no fill.
  Tensor out = empty({m, n}, DType::f32, a.device());
  // Empty operands: the result is zeros (BLAS rejects zero leading dims).
  if (k == 0) out.fill_(0);
  if (m > 0 && n > 0 && k > 0) {
    auto* pa = static_cast<const float*>(ra.raw_ptr());
    auto* pb = static_cast<const float*>(rb.raw_ptr());
    auto* pc = static_cast<float*>(out.raw_ptr());
    if (kind == Gemm::fixed_order)
      dk.gemm_fixed(ta, tb, m, n, k, pa, a.size(1), pb, b.size(1), pc, n, {});
    else
      dk.gemm(ta, tb, m, n, k, 1.f, pa, a.size(1), pb, b.size(1), 0.f, pc, n);
  }
  Tensor da = ra.detach(), db = rb.detach();
  bool need_a = a.requires_grad(), need_b = b.requires_grad();
  return record_op("matmul", out, {a, b}, {a, b}, [=](const Tensor& g) -> std::vector<Tensor> {
    return matmul_grads(da, db, product_input(g), ta, tb, need_a, need_b, wants_unit_partials(0),
                        wants_unit_partials(1));
  });
}

}  // namespace

std::vector<Tensor> matmul_grads(const Tensor& a, const Tensor& b, const Tensor& g, bool ta, bool tb, bool need_a,
                                 bool need_b, bool partials_a, bool partials_b) {
  // C = op(A) op(B):  dA = g op(B)^T (or its transpose), dB = op(A)^T g (or its transpose).
  Tensor ga, gb;
  const Gemm kind = exact_batch() ? Gemm::fixed_order : Gemm::library;
  if (need_a)
    ga = partials_a ? unit_partials_of_a(a, b, g, ta, tb)
         : ta       ? matmul_with(kind, b, g, tb, true, true)
                    : matmul_with(kind, g, b, false, !tb, true);
  if (need_b)
    gb = partials_b ? unit_partials_of_b(a, b, g, ta, tb)
         : tb       ? matmul_with(kind, g, a, true, ta, true)
                    : matmul_with(kind, a, g, !ta, false, true);
  return {ga, gb};
}

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  return matmul_with(Gemm::fixed_order, a, b, ta, tb, false);
}

}  // namespace vqddp
