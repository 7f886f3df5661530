// The floating-point operations of each kernel-table call (engine/device.h,
// vq/kernels/vq_kernels.h), from its arguments: one formula per kernel, used
// by every backend that counts (the CPU's table, and the CUDA wrapper's), so
// `vqddp train --profile` can say how far a step is from the GEMM floor.
//
// The convention, the usual one for a roofline:
//   - a multiply-add is 2 (a product of m x k by k x n is 2 m n k);
//   - an elementwise formula counts its arithmetic per element (a binary op
//     1, AdamW's update 14), a transcendental function 1;
//   - a sum of n values n (the first addition to 0 included);
//   - copies, fills, gathers, comparisons and checks 0: they move or test
//     data, they compute nothing.
// Each count is the formula's, not the instructions a kernel happens to
// issue: a padded lane or a recomputed value adds nothing, so the same call
// counts the same on every backend and ISA, and a faster kernel shows as
// more GFLOP/s, never as fewer FLOPs.
// Internal header: not installed with the library (the profile's counts).
#pragma once

#include <cstdint>

#include "engine/conv_plan.h"
#include "engine/device.h"

namespace vqddp::kernel_flops {

inline int64_t elements(const int64_t* shape, int ndim) {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

inline int64_t binary(const BroadcastPlan& p) { return elements(p.shape, p.ndim); }
inline int64_t unary(int64_t n) { return n; }
// The derivative and its product with the incoming gradient.
inline int64_t unary_backward(int64_t n) { return 2 * n; }
inline int64_t reduce_sum(const ReducePlan& p) {
  return elements(p.keep_size, p.nkeep) * elements(p.red_size, p.nred) + (p.divisor != 1.0 ? elements(p.keep_size, p.nkeep) : 0);
}
inline int64_t gemm(int64_t m, int64_t n, int64_t k, int64_t count = 1) { return 2 * m * n * k * count; }
// A convolution's product, forward, data or weight gradient alike: every
// output position times every output channel times the receptive field.
inline int64_t conv(const ConvPlan& p, int64_t cout) { return 2 * p.rows() * cout * p.col_width(); }
// The bias: one addition per output element (forward), or one term of its
// gradient's sum per output element.
inline int64_t conv_bias(const ConvPlan& p, int64_t cout) { return p.rows() * cout; }
// A conv_fixed, conv_fixed_data or conv_fixed_weight call: the product and,
// where it has one, the bias (or the bias partials).
inline int64_t conv_fixed(const ConvPlan& p, int64_t cout, bool bias) {
  return conv(p, cout) + (bias ? conv_bias(p, cout) : 0);
}
// col2im adds each column value into its image position.
inline int64_t col2im(const ConvPlan& p) { return p.rows() * p.col_width(); }
inline int64_t unit_sums(const UnitSumBlock* blocks, int64_t count) {
  int64_t f = 0;
  for (int64_t i = 0; i < count; ++i) f += blocks[i].units * blocks[i].n;
  return f;
}
inline int64_t total(const int64_t* ns, int64_t count) {
  int64_t n = 0;
  for (int64_t i = 0; i < count; ++i) n += ns[i];
  return n;
}
// Per element: a scale, a count and a sum (index_add_rows with counts), or
// one addition (index_add_rows_f32).
inline int64_t index_add_rows(int64_t n, int64_t d, bool counts) { return n * d + (counts ? n : 0); }
// index_copy_rows scales each copied element.
inline int64_t index_copy_rows(int64_t m, int64_t d) { return m * d; }
// sum_squares: a square and an addition an element; clip_scale a product.
inline int64_t sum_squares(const int64_t* ns, int64_t count) { return 2 * total(ns, count); }
inline int64_t clip_scale(const int64_t* ns, int64_t count) { return total(ns, count); }
inline constexpr int64_t kClipNorm = 1;  // the square root
// Momentum: buf = mu buf + g, p -= lr buf (and its weight decay): 4.
inline int64_t sgd(int64_t n) { return 4 * n; }
// AdamW per element: two moments (3 and 4), their bias corrections (2), the
// square root, epsilon and quotient (3), decay and step (2).
inline int64_t adamw(const AdamWTensor* tensors, int64_t count) {
  int64_t n = 0;
  for (int64_t i = 0; i < count; ++i) n += tensors[i].n;
  return 14 * n;
}
// Weight normalization, forward: a squared norm per row (2 a weight) and a
// scale (1); backward: the row's dot product with the gradient (2), then dv
// from it (3).
inline int64_t weight_norm(const WeightNormTensor* tensors, int64_t count, bool backward) {
  int64_t n = 0;
  for (int64_t i = 0; i < count; ++i) n += tensors[i].rows * tensors[i].cols;
  return (backward ? 5 : 3) * n;
}
// Mean squared error: a difference, a square and a sum per element.
inline int64_t mse(int64_t n) { return 3 * n; }

// ---- the VQ table ----
// Nearest code: every row's distance to every code (a product) and each
// code's squared norm.
inline int64_t vq_assign(int64_t n, int64_t k, int64_t d) { return 2 * n * k * d + 2 * k * d; }
// EMA of counts and sums (3 each), then the smoothed mean (1 a weight).
inline int64_t vq_ema_update(int64_t k, int64_t d) { return 3 * k + 4 * k * d; }
inline int64_t vq_kmeans_update(int64_t k, int64_t d) { return k * d; }
// FSQ and LFQ: a few operations per code element, counted as 2.
inline int64_t vq_scalar_codes(int64_t n) { return 2 * n; }

}  // namespace vqddp::kernel_flops
