// The CPU's DeviceKernels: the reference arithmetic of every op.
//
// These are the loops the ops ran themselves before the CPU became one more
// backend; each keeps its order of operations, so its bits are the ones the
// tests and the golden files pin. Broadcasts, reductions and copies arrive
// as plans (engine/device.h); the common shapes of those plans get the tight
// loops they had as special cases in the ops (same shape, a scalar operand,
// a bias row, a sum over the middle of [outer, n, inner]), and everything
// else walks the plan's strides. The fast paths compute exactly what the
// walk would, element by element in the same order: they change speed only.
#include "engine/cpu/cpu_kernels.h"

#include "engine/device_counters.h"
#include "engine/kernel_flops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "engine/cpu/blas.h"
#include "engine/core/cpu_allocator.h"
#include "engine/cpu/fixed_gemm.h"
#include "engine/cpu/fixed_conv.h"
#include "engine/cpu/unary_loops.h"
#include "engine/kernel_math.h"
#include "engine/cpu/parallel.h"
#include "engine/unit_sum.h"

namespace vqddp {

namespace {

// A loop nest over the dims of a plan for N operands' strides: dims of size
// 1 are dropped, and a dim is merged into the one before it where every
// operand steps over both as one, so the innermost loop is as long as it
// can be. Iterating the nest in row-major order visits the elements in the
// plan's row-major order.
template <int N>
struct Nest {
  int ndim = 0;
  int64_t size[kMaxDims] = {};
  int64_t stride[N][kMaxDims] = {};
  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= size[d];
    return n;
  }
};

template <int N>
Nest<N> make_nest(int ndim, const int64_t* size, const int64_t* const (&strides)[N]) {
  Nest<N> s;
  for (int d = 0; d < ndim; ++d) {
    if (size[d] == 1) continue;
    int j = s.ndim;
    bool merge = j > 0;
    for (int o = 0; merge && o < N; ++o) merge = s.stride[o][j - 1] == strides[o][d] * size[d];
    if (merge) {
      s.size[j - 1] *= size[d];
      for (int o = 0; o < N; ++o) s.stride[o][j - 1] = strides[o][d];
    } else {
      s.size[j] = size[d];
      for (int o = 0; o < N; ++o) s.stride[o][j] = strides[o][d];
      ++s.ndim;
    }
  }
  return s;
}

// Calls row(off, len, step) for every row of the nest's innermost dim in
// row-major order: off[o] is the row's first element in operand o, step[o]
// its stride along the row. A nest without dims is one row of one element.
template <int N, class Row>
void for_each_row(const Nest<N>& s, Row&& row) {
  int64_t off[N] = {}, step[N] = {};
  if (s.ndim == 0) {
    row(off, int64_t{1}, step);
    return;
  }
  int last = s.ndim - 1;
  int64_t rows = 1, count[kMaxDims] = {};
  for (int d = 0; d < last; ++d) rows *= s.size[d];
  if (rows == 0 || s.size[last] == 0) return;
  for (int o = 0; o < N; ++o) step[o] = s.stride[o][last];
  for (int64_t r = 0; r < rows; ++r) {
    row(off, s.size[last], step);
    for (int d = last - 1; d >= 0; --d) {
      for (int o = 0; o < N; ++o) off[o] += s.stride[o][d];
      if (++count[d] < s.size[d]) break;
      for (int o = 0; o < N; ++o) off[o] -= s.stride[o][d] * s.size[d];
      count[d] = 0;
    }
  }
}

int64_t product(const int64_t* size, int ndim) {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= size[d];
  return n;
}

// Elements of a broadcast operand: the output dims it does not repeat.
int64_t operand_numel(const BroadcastPlan& p, const int64_t* stride) {
  int64_t n = 1;
  for (int d = 0; d < p.ndim; ++d)
    if (stride[d] != 0) n *= p.shape[d];
  return n;
}

// True when the operand is a dense block of the output's trailing dims
// ([D] against [N, D]): its elements are the output's innermost ones.
bool is_trailing_block(const BroadcastPlan& p, const int64_t* stride, int64_t numel) {
  int first = 0;
  while (first < p.ndim && stride[first] == 0) ++first;
  return numel > 0 && product(p.shape + first, p.ndim - first) == numel;
}

template <BinaryOp Op>
void binary_as(const float* pa, const float* pb, float* po, const BroadcastPlan& p) {
  auto f = [](float x, float y) { return apply_binary(Op, x, y); };  // Op is a constant: inlined per op
  int64_t n = product(p.shape, p.ndim);
  if (n == 0) return;
  int64_t na = operand_numel(p, p.stride_a), nb = operand_numel(p, p.stride_b);
  if (na == n && nb == n) {
    parallel_for_ranges(n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) po[i] = f(pa[i], pb[i]);
    });
  } else if (na == n && nb == 1) {
    parallel_for_ranges(n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) po[i] = f(pa[i], pb[0]);
    });
  } else if (na == 1 && nb == n) {
    parallel_for_ranges(n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) po[i] = f(pa[0], pb[i]);
    });
  } else if (na == n && is_trailing_block(p, p.stride_b, nb)) {
    // Trailing-row broadcast ([N, D] op [D]): the hot case of Linear's bias.
    parallel_for_ranges(n / nb, nb, [&](int64_t b, int64_t e) {
      for (int64_t i = b * nb; i < e * nb; i += nb)
        for (int64_t j = 0; j < nb; ++j) po[i + j] = f(pa[i + j], pb[j]);
    });
  } else {
    Nest<2> s = make_nest<2>(p.ndim, p.shape, {p.stride_a, p.stride_b});
    for_each_row(s, [&](const int64_t* off, int64_t len, const int64_t* step) {
      const float *ra = pa + off[0], *rb = pb + off[1];
      for (int64_t j = 0; j < len; ++j) po[j] = f(ra[j * step[0]], rb[j * step[1]]);
      po += len;
    });
  }
}

// A plan that sums the middle of a row-major [outer, n, inner] (what
// sum_dim_plan describes, and sum_to_plan for leading or trailing dims, a
// bias gradient [N, D] -> [D] among them): true, with the three sizes.
bool as_outer_n_inner(const ReducePlan& p, int64_t& outer, int64_t& n, int64_t& inner) {
  Nest<1> keep = make_nest<1>(p.nkeep, p.keep_size, {p.keep_stride});
  Nest<1> red = make_nest<1>(p.nred, p.red_size, {p.red_stride});
  if (red.ndim > 1 || keep.ndim > 2) return false;
  n = red.ndim == 1 ? red.size[0] : 1;
  int64_t red_stride = red.ndim == 1 ? red.stride[0][0] : 1;
  outer = 1;
  inner = 1;
  int d = 0;
  if (keep.ndim == 2 || (keep.ndim == 1 && keep.stride[0][0] != 1)) {
    outer = keep.size[0];
    if (keep.stride[0][0] == 0) return false;
    d = 1;
  }
  if (d < keep.ndim) {
    if (keep.stride[0][d] != 1) return false;
    inner = keep.size[d];
  }
  return (n == 1 || red_stride == inner) && (outer == 1 || keep.stride[0][0] == n * inner);
}

// A strided row copy of T elements (a typed loop, not a memcpy call per
// element: transposes are rows of single elements).
template <class T>
void copy_row(const char* from, char* to, int64_t len, const int64_t* step) {
  const T* f = reinterpret_cast<const T*>(from);
  T* t = reinterpret_cast<T*>(to);
  for (int64_t j = 0; j < len; ++j) t[j * step[1]] = f[j * step[0]];
}

void copy_rows(const void* src, void* dst, size_t elem_size, const Nest<2>& s) {
  auto* ps = static_cast<const char*>(src);
  auto* pd = static_cast<char*>(dst);
  for_each_row(s, [&](const int64_t* off, int64_t len, const int64_t* step) {
    const char* from = ps + off[0] * elem_size;
    char* to = pd + off[1] * elem_size;
    if (step[0] == 1 && step[1] == 1) {
      std::memcpy(to, from, len * elem_size);
      return;
    }
    switch (elem_size) {
      case 4: copy_row<uint32_t>(from, to, len, step); break;
      case 8: copy_row<uint64_t>(from, to, len, step); break;
      default:
        for (int64_t j = 0; j < len; ++j)
          std::memcpy(to + j * step[1] * elem_size, from + j * step[0] * elem_size, elem_size);
    }
  });
}

template <class T>
void fill_as(void* p, int64_t n, double value) {
  T* t = static_cast<T*>(p);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<T>(value);
}

}  // namespace

void* CpuKernels::alloc(size_t bytes) { return cpu_alloc(bytes); }

void CpuKernels::release(void* p, size_t bytes) { cpu_free(p, bytes); }

// memmove: a tensor may be copied onto itself or an overlapping view.
void CpuKernels::copy(void* dst, bool, const void* src, bool, size_t bytes) {
  if (bytes > 0) std::memmove(dst, src, bytes);
}

void CpuKernels::fill(void* p, DType dtype, int64_t n, double value) {
  switch (dtype) {
    case DType::f32: fill_as<float>(p, n, value); break;
    case DType::i64: fill_as<int64_t>(p, n, value); break;
    case DType::f64: fill_as<double>(p, n, value); break;
  }
}

void CpuKernels::synchronize() {}

void CpuKernels::binary(BinaryOp op, const float* a, const float* b, float* out, const BroadcastPlan& plan) {
  count_flops(kernel_flops::binary(plan));
  switch (op) {
    case BinaryOp::add: binary_as<BinaryOp::add>(a, b, out, plan); break;
    case BinaryOp::sub: binary_as<BinaryOp::sub>(a, b, out, plan); break;
    case BinaryOp::mul: binary_as<BinaryOp::mul>(a, b, out, plan); break;
    case BinaryOp::div: binary_as<BinaryOp::div>(a, b, out, plan); break;
  }
}

// On the widest vectors the CPU has (fixed_gemm.h's instruction sets).
void CpuKernels::unary(const UnaryFn& fn, const float* x, float* out, int64_t n) {
  count_flops(kernel_flops::unary(n));
  parallel_for_ranges(n, 1, [&](int64_t b, int64_t e) { cpu_unary(fn, x + b, out + b, e - b); });
}

void CpuKernels::unary_backward(const UnaryFn& fn, const float* x, const float* y, const float* g, float* out,
                                int64_t n) {
  count_flops(kernel_flops::unary_backward(n));
  parallel_for_ranges(n, 1, [&](int64_t b, int64_t e) { cpu_unary_backward(fn, x + b, y + b, g + b, out + b, e - b); });
}

void CpuKernels::cast_f64_to_f32(const double* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// Each output: +0 in double, plus its reduced elements in ascending
// row-major order, divided by the divisor in double, rounded once. A plan
// that reduces nothing (the backward of a sum, repeating g) divides each
// element as it is, without the +0, so -0 stays -0.
void CpuKernels::reduce_sum(const float* x, float* out, const ReducePlan& plan) {
  count_flops(kernel_flops::reduce_sum(plan));
  if (product(plan.keep_size, plan.nkeep) == 0) return;
  double divisor = plan.divisor;
  if (plan.nred == 0) {
    Nest<1> keep = make_nest<1>(plan.nkeep, plan.keep_size, {plan.keep_stride});
    for_each_row(keep, [&](const int64_t* off, int64_t len, const int64_t* step) {
      for (int64_t j = 0; j < len; ++j) out[j] = static_cast<float>(x[off[0] + j * step[0]] / divisor);
      out += len;
    });
    return;
  }
  int64_t outer, n, inner;
  if (as_outer_n_inner(plan, outer, n, inner)) {
    if (inner == 1) {
      // Sums of contiguous rows (a bias gradient per example, [C, L] ->
      // [C]): 8 rows side by side, each its own chain in its own order,
      // since one chain of double adds waits on the add's latency.
      constexpr int64_t kLanes = 8;
      parallel_for_ranges(outer, n, [&](int64_t begin, int64_t end) {
        int64_t o = begin;
        for (; o + kLanes <= end; o += kLanes) {
          double acc8[kLanes] = {};
          const float* rows = x + o * n;
          for (int64_t k = 0; k < n; ++k)
            for (int64_t b = 0; b < kLanes; ++b) acc8[b] += rows[b * n + k];
          for (int64_t b = 0; b < kLanes; ++b) out[o + b] = static_cast<float>(acc8[b] / divisor);
        }
        for (; o < end; ++o) {
          double acc1 = 0.0;
          for (int64_t k = 0; k < n; ++k) acc1 += x[o * n + k];
          out[o] = static_cast<float>(acc1 / divisor);
        }
      });
      return;
    }
    // Rows of [n, inner] streamed into one accumulator per column.
    std::vector<double> acc(inner);
    for (int64_t o = 0; o < outer; ++o) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t k = 0; k < n; ++k) {
        const float* row = x + (o * n + k) * inner;
        for (int64_t i = 0; i < inner; ++i) acc[i] += row[i];
      }
      for (int64_t i = 0; i < inner; ++i) out[o * inner + i] = static_cast<float>(acc[i] / divisor);
    }
    return;
  }
  Nest<1> keep = make_nest<1>(plan.nkeep, plan.keep_size, {plan.keep_stride});
  Nest<1> red = make_nest<1>(plan.nred, plan.red_size, {plan.red_stride});
  // Up to kLanes outputs at once, each its own chain in its own order: a
  // chain of double adds is bound by the add's latency, so independent
  // chains side by side run several times faster, with the same bits.
  constexpr int64_t kLanes = 8;
  for_each_row(keep, [&](const int64_t* koff, int64_t klen, const int64_t* kstep) {
    for (int64_t j0 = 0; j0 < klen; j0 += kLanes) {
      const int64_t lanes = std::min(kLanes, klen - j0);
      const float* base = x + koff[0] + j0 * kstep[0];
      const int64_t ks = kstep[0];
      double acc[kLanes] = {};
      for_each_row(red, [&](const int64_t* roff, int64_t rlen, const int64_t* rstep) {
        const float* row = base + roff[0];
        if (lanes == kLanes) {
          for (int64_t r = 0; r < rlen; ++r)
            for (int64_t b = 0; b < kLanes; ++b) acc[b] += row[b * ks + r * rstep[0]];
        } else {
          for (int64_t r = 0; r < rlen; ++r)
            for (int64_t b = 0; b < lanes; ++b) acc[b] += row[b * ks + r * rstep[0]];
        }
      });
      for (int64_t b = 0; b < lanes; ++b) *out++ = static_cast<float>(acc[b] / divisor);
    }
  });
}

void CpuKernels::arg_best(const float* x, int64_t* out, float* values, int64_t rows, int64_t k, bool max) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t best = best_in_row(x + r * k, k, max);
    if (out) out[r] = best;
    if (values) values[r] = x[r * k + best];
  }
}

int64_t CpuKernels::first_nonfinite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return i;
  return -1;
}

void CpuKernels::min_max_i64(const int64_t* x, int64_t n, int64_t* lo, int64_t* hi) {
  auto [l, h] = std::minmax_element(x, x + n);
  *lo = *l;
  *hi = *h;
}

void CpuKernels::gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                      const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  count_flops(kernel_flops::gemm(m, n, k));
  blas_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

namespace {

// gemm_fixed's and col2im's work, for the convolutions' column path too,
// which counts its FLOPs as a convolution's (the table's entries count
// theirs once each).
void gemm_fixed_batch(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                      int64_t ldb, float* c, int64_t ldc, const GemmBatch& batch) {
  if (batch.count == 1) {
    fixed_gemm(ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
    return;
  }
  // The products at once on the engine's threads: each writes its own C by
  // its own chains, so the bits do not depend on the threads.
  parallel_for(batch.count, [&](int64_t i) {
    fixed_gemm(ta, tb, m, n, k, a + i * batch.stride_a, lda, b + i * batch.stride_b, ldb, c + i * batch.stride_c, ldc);
  });
}

}  // namespace

void CpuKernels::gemm_fixed(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                            int64_t ldb, float* c, int64_t ldc, const GemmBatch& batch) {
  count_flops(kernel_flops::gemm(m, n, k, batch.count));
  gemm_fixed_batch(ta, tb, m, n, k, a, lda, b, ldb, c, ldc, batch);
}

void CpuKernels::strided_copy(const void* src, void* dst, size_t elem_size, const StridedCopyPlan& plan) {
  Nest<2> whole = make_nest<2>(plan.ndim, plan.shape, {plan.src_stride, plan.dst_stride});
  if (whole.ndim < 2 || whole.numel() == 0) {
    copy_rows(src, dst, elem_size, whole);
    return;
  }
  // Split over the outermost dim: each range copies its own elements.
  parallel_for_ranges(whole.size[0], whole.numel() / whole.size[0], [&](int64_t b, int64_t e) {
    Nest<2> part = whole;
    part.size[0] = e - b;
    copy_rows(static_cast<const char*>(src) + b * whole.stride[0][0] * elem_size,
              static_cast<char*>(dst) + b * whole.stride[1][0] * elem_size, elem_size, part);
  });
}

void CpuKernels::copy_blocks(const CopyBlock* blocks, int64_t count, size_t elem_size) {
  for (int64_t b = 0; b < count; ++b) {
    const CopyBlock& c = blocks[b];
    // An empty block may have no addresses at all (a graphed step's empty
    // tensors are nullptr): nothing to touch.
    if (c.rows == 0 || c.width == 0) continue;
    if (!c.src) {  // all-zero bytes are +0 in every dtype
      for (int64_t r = 0; r < c.rows; ++r)
        std::memset(static_cast<char*>(c.dst) + r * c.dst_row * elem_size, 0, c.width * elem_size);
      continue;
    }
    StridedCopyPlan p;
    p.ndim = 2;
    p.shape[0] = c.rows;
    p.shape[1] = c.width;
    p.src_stride[0] = c.src_row;
    p.src_stride[1] = 1;
    p.dst_stride[0] = c.dst_row;
    p.dst_stride[1] = 1;
    strided_copy(c.src, c.dst, elem_size, p);
  }
}

void CpuKernels::gather_rows(const void* x, const int64_t* index, int64_t m, size_t row_bytes, void* out) {
  auto* px = static_cast<const char*>(x);
  auto* po = static_cast<char*>(out);
  for (int64_t i = 0; i < m; ++i) std::memcpy(po + i * row_bytes, px + index[i] * row_bytes, row_bytes);
}

void CpuKernels::max_abs_finite(const float* x, int64_t n, double* acc) {
  float largest = 0.f;
  for (int64_t i = 0; i < n; ++i)
    if (std::isfinite(x[i])) largest = std::max(largest, std::fabs(x[i]));
  *acc = std::max(*acc, static_cast<double>(largest));
}

void CpuKernels::unit_sums(const UnitSumBlock* blocks, int64_t count) {
  count_flops(kernel_flops::unit_sums(blocks, count));
  for (int64_t b = 0; b < count; ++b) {
    const UnitSumBlock& u = blocks[b];
    parallel_for_ranges(u.n, u.units, [&](int64_t begin, int64_t end) {
      ordered_unit_sum({u.in}, {u.units}, u.n, {u.out}, begin, end);  // one rank's units: the transports' sum
    });
  }
}

void CpuKernels::index_add_rows(const float* src, const int64_t* index, int64_t n, int64_t d, int64_t k, double* counts,
                                double* sums, const double* grid_max) {
  count_flops(kernel_flops::index_add_rows(n, d, true));
  if (counts) std::fill(counts, counts + k, 0.0);
  std::fill(sums, sums + k * d, 0.0);
  const double q = grid_max ? grid_quantum(*grid_max) : 0.0;
  for (int64_t i = 0; i < n; ++i) {
    int64_t c = index[i];
    if (c < 0 || c >= k) continue;
    if (counts) counts[c] += 1.0;
    double* to = sums + c * d;
    const float* from = src + i * d;
    if (grid_max)
      for (int64_t j = 0; j < d; ++j) to[j] += to_grid(from[j], q);
    else
      for (int64_t j = 0; j < d; ++j) to[j] += from[j];
  }
}

// im2col_taps_at's entries, row by row: where a row's taps all lie inside
// the image along x (most rows) they are read without a bounds check per
// tap. The same values in the same places, so the same bits; and each
// image row's columns are one task.
void CpuKernels::im2col(const float* x, float* cols, const ConvPlan& p) {
  const int64_t span = (p.kw - 1) * p.dw, width = p.col_width();
  parallel_for_ranges(p.n * p.oh, p.ow * width, [&](int64_t begin, int64_t end) {
    for (int64_t so = begin; so < end; ++so) {
      const int64_t s = so / p.oh, oy = so % p.oh;
      for (int64_t ox = 0; ox < p.ow; ++ox) {
        const int64_t ix0 = ox * p.sw - p.pw;
        if (ix0 < 0 || ix0 + span >= p.w) {
          for (int64_t ch = 0; ch < p.c; ++ch) im2col_taps_at(x, p, s, oy, ox, ch, cols);
          continue;
        }
        float* out = cols + (so * p.ow + ox) * width;
        for (int64_t ch = 0; ch < p.c; ++ch) {
          const float* img = x + (s * p.c + ch) * p.h * p.w + ix0;
          for (int64_t ky = 0; ky < p.kh; ++ky, out += p.kw) {
            const int64_t iy = oy * p.sh - p.ph + ky * p.dh;
            if (iy < 0 || iy >= p.h) {
              for (int64_t kx = 0; kx < p.kw; ++kx) out[kx] = 0.f;
              continue;
            }
            const float* from = img + iy * p.w;
            for (int64_t kx = 0; kx < p.kw; ++kx) out[kx] = from[kx * p.dw];
          }
        }
      }
    }
  });
}

namespace {

void col2im_rows(const float* cols, float* x, const ConvPlan& plan) {
  parallel_for_ranges(plan.n * plan.c * plan.h, plan.w * plan.kh * plan.kw, [&](int64_t begin, int64_t end) {
    std::vector<double> acc(static_cast<size_t>(plan.w));
    for (int64_t row = begin; row < end; ++row) col2im_row(cols, plan, row, acc.data(), x);
  });
}

}  // namespace

void CpuKernels::col2im(const float* cols, float* x, const ConvPlan& plan) {
  count_flops(kernel_flops::col2im(plan));
  col2im_rows(cols, x, plan);
}

namespace {

// y[s, c, i] += bias[c] over [n, channels, size]: the bias add after a
// convolution's sums, in the kernel that made them.
void add_channel_bias(float* y, const float* bias, int64_t n, int64_t channels, int64_t size) {
  parallel_for_ranges(n * channels, size, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t i = 0; i < size; ++i) y[r * size + i] = add_rn(y[r * size + i], bias[r % channels]);
  });
}

// Columns the kernel writes in full before it reads them: not zeroed. From
// cpu_alloc like a tensor, so the column buffers (tens of MiB for a
// validation chunk's upsampling convolutions) count in the block cache's
// bound (engine/core/cpu_allocator.cpp). From new[], glibc served them from
// its per-thread heaps once its mmap threshold had risen, and those heaps
// kept up to 2x that threshold free each: more the more chunks 4 rank
// threads validated.
struct ScratchFree {
  size_t bytes;
  void operator()(float* p) const { cpu_free(p, bytes); }
};
using Scratch = std::unique_ptr<float[], ScratchFree>;
Scratch scratch(int64_t n) {
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  return Scratch(static_cast<float*>(cpu_alloc(bytes)), ScratchFree{bytes});
}

}  // namespace

// The three convolution kernels on the CPU: where they pay
// (direct_conv_paths: every direction of a plan whose width stride is 1,
// which is every convolution of the main job but the two downsampling ones
// and every discriminator's; some of a width-strided one's), fixed_conv.h's
// direct kernels, which give the column path's bits with no im2col buffer;
// otherwise the column path itself, the columns in a scratch buffer
// (im2col, the SIMD fixed_gemm, col2im), which is what conv_plan.h's
// per-element formulas reproduce without them. The choice is the kernel
// table's, as a GPU's choice of its own kernels: the op takes one path on
// every device.
void CpuKernels::conv_fixed(const float* x, const float* w, const float* bias, int64_t cout, float* y,
                            const ConvPlan& p) {
  count_flops(kernel_flops::conv_fixed(p, cout, bias != nullptr));
  const int64_t pos = p.oh * p.ow, ck = p.col_width();
  if (direct_conv_paths(p).forward) {
    fixed_conv(p, x, cout, w, y);
    if (bias) add_channel_bias(y, bias, p.n, cout, pos);
    return;
  }
  // One product over every sample's positions, [n pos, cout] (a sample's
  // own product has only its pos columns, 22 to 40 for the codec's strided
  // convolutions and the STFT's: 1.4-1.8x slower), then into y's layout
  // with the bias added on the way. Each element is the same chain with
  // fma's operands swapped, and fma's product is exact: the same bits.
  Scratch cols = scratch(p.rows() * ck);
  im2col(x, cols.get(), p);
  Scratch rows = scratch(p.rows() * cout);
  gemm_fixed_batch(false, true, p.rows(), cout, ck, cols.get(), ck, w, ck, rows.get(), cout, {});
  const float* t = rows.get();
  parallel_for_ranges(p.n * cout, pos, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; ++e) {
      const int64_t s = e / cout, co = e % cout;
      const float* from = t + s * pos * cout + co;
      float* to = y + e * pos;
      if (bias)
        for (int64_t i = 0; i < pos; ++i) to[i] = add_rn(from[i * cout], bias[co]);
      else
        for (int64_t i = 0; i < pos; ++i) to[i] = from[i * cout];
    }
  });
}

void CpuKernels::conv_fixed_data(const float* g, const float* w, const float* bias, int64_t cout, float* dx,
                                 const ConvPlan& p) {
  count_flops(kernel_flops::conv_fixed(p, cout, bias != nullptr));
  const int64_t pos = p.oh * p.ow, ck = p.col_width(), image = p.h * p.w;
  if (direct_conv_paths(p).data) {
    fixed_conv_data(p, cout, g, w, dx);
  } else {
    // g as rows [n pos, cout], then one product over every sample's
    // positions (1.3-1.5x a product per sample), the same chains.
    Scratch rows = scratch(p.rows() * cout);
    float* t = rows.get();
    parallel_for_ranges(p.n * pos, cout, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t s = r / pos, i = r % pos;
        const float* from = g + s * cout * pos + i;
        for (int64_t co = 0; co < cout; ++co) t[r * cout + co] = from[co * pos];
      }
    });
    Scratch cols = scratch(p.rows() * ck);
    gemm_fixed_batch(false, false, p.rows(), ck, cout, t, cout, w, ck, cols.get(), ck, {});
    col2im_rows(cols.get(), dx, p);
  }
  if (bias) add_channel_bias(dx, bias, p.n, p.c, image);
}

void CpuKernels::conv_fixed_weight(const float* x, const float* g, int64_t cout, float* partials,
                                   float* bias_partials, const ConvPlan& p) {
  count_flops(kernel_flops::conv_fixed(p, cout, bias_partials != nullptr));
  const int64_t pos = p.oh * p.ow, ck = p.col_width();
  if (direct_conv_paths(p).weight) {
    fixed_conv_weight(p, x, cout, g, partials);
  } else {
    Scratch cols = scratch(p.rows() * ck);
    im2col(x, cols.get(), p);
    gemm_fixed_batch(false, false, cout, ck, pos, g, pos, cols.get(), ck, partials, ck,
               {p.n, cout * pos, pos * ck, cout * ck});
  }
  if (!bias_partials) return;
  // conv_bias_value's chains, eight rows at a time: each row's double sum
  // is a chain of dependent additions, so one row at a time waited an
  // addition's latency per float; eight interleaved keep the adder busy.
  // Each chain is the same, in the same order: the same bits.
  constexpr int64_t kRows = 8;
  const int64_t rows = p.n * cout;
  parallel_for_ranges((rows + kRows - 1) / kRows, kRows * pos, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t e0 = b * kRows;
      if (e0 + kRows > rows) {
        for (int64_t e = e0; e < rows; ++e) bias_partials[e] = conv_bias_value(g, p, e);
        continue;
      }
      double acc[kRows] = {};
      const float* row = g + e0 * pos;
      for (int64_t i = 0; i < pos; ++i)
        for (int64_t r = 0; r < kRows; ++r) acc[r] += row[r * pos + i];
      for (int64_t r = 0; r < kRows; ++r) bias_partials[e0 + r] = static_cast<float>(acc[r]);
    }
  });
}

void CpuKernels::index_copy_rows(const float* src, const int64_t* index, int64_t m, int64_t d, float scale,
                                 float* dst) {
  count_flops(kernel_flops::index_copy_rows(m, d));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < d; ++j) dst[index[i] * d + j] = src[i * d + j] * scale;
}

void CpuKernels::sgd_step(const SgdStep& step, float* p, const float* g, float* buf, int64_t n) {
  count_flops(kernel_flops::sgd(n));
  SgdStep s = step;
  s.lr = step.scalars[0];
  parallel_for_ranges(n, 4, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) sgd_update(s, p[j], g[j], buf[j]);
  });
}

void CpuKernels::adamw_step(const AdamWStep& step, const AdamWTensor* tensors, int64_t count) {
  count_flops(kernel_flops::adamw(tensors, count));
  // One split of every tensor's elements laid end to end, not one per
  // tensor: a model's many small tensors (biases, norms' gains) would each
  // pay a hand-off. Every element is its own update, so no split changes a bit.
  std::vector<int64_t> start(count + 1, 0);
  for (int64_t t = 0; t < count; ++t) start[t + 1] = start[t] + tensors[t].n;
  parallel_for_ranges(start[count], 8, [&](int64_t b, int64_t e) {
    int64_t t = std::upper_bound(start.begin(), start.end(), b) - start.begin() - 1;
    for (; b < e; ++t) {
      const AdamWTensor& a = tensors[t];
      const int64_t from = b - start[t], to = std::min(e, start[t + 1]) - start[t];
      AdamWStep s = step;
      s.lr = step.scalars[0];
      s.c1 = step.scalars[a.scalar];
      s.sqrt_c2 = step.scalars[a.scalar + 1];
      cpu_adamw(s, a.p + from, a.g + from, a.m + from, a.v + from, to - from);
      b = start[t] + to;
    }
  });
}

void CpuKernels::sum_squares(const float* const* xs, const int64_t* ns, int64_t count, double* acc) {
  count_flops(kernel_flops::sum_squares(ns, count));
  double total = *acc;  // one running sum over every tensor in turn
  for (int64_t t = 0; t < count; ++t)
    for (int64_t j = 0; j < ns[t]; ++j) total += double(xs[t][j]) * xs[t][j];
  *acc = total;
}

void CpuKernels::clip_scale(float* const* xs, const int64_t* ns, int64_t count, const double* total_sq,
                            float max_norm) {
  count_flops(kernel_flops::clip_scale(ns, count));
  double factor = clip_factor(*total_sq, max_norm);
  if (!(factor < 1.0)) return;
  for (int64_t t = 0; t < count; ++t)
    for (int64_t j = 0; j < ns[t]; ++j) xs[t][j] = vqddp::scale_f64(xs[t][j], factor);
}

void CpuKernels::clip_norm(const double* total_sq, float* norm) {
  count_flops(kernel_flops::kClipNorm);
  *norm = static_cast<float>(std::sqrt(*total_sq));
}

namespace {

// Every tensor's rows in groups of kWeightNormRows, as tasks of one
// parallel_for over all of them: one hand-off for the model instead of one
// per layer, and each group's rows side by side (kernel_math.h's
// weight_norm_rows). `rows_fn(R, a, row)` takes R rows of tensor a from
// `row`, R a std::integral_constant: kWeightNormRows, or 1 for each row of
// a tensor's shorter last group.
constexpr int kWeightNormRows = 8;

template <typename RowsFn>
void for_weight_norm_groups(const WeightNormTensor* tensors, int64_t count, RowsFn rows_fn) {
  std::vector<int64_t> first(static_cast<size_t>(count) + 1, 0);  // each tensor's first task
  for (int64_t t = 0; t < count; ++t)
    first[t + 1] = first[t] + (tensors[t].rows + kWeightNormRows - 1) / kWeightNormRows;
  parallel_for(first[count], [&](int64_t task) {
    const int64_t t = std::upper_bound(first.begin(), first.end(), task) - first.begin() - 1;
    const WeightNormTensor& a = tensors[t];
    const int64_t row = (task - first[t]) * kWeightNormRows;
    if (a.rows - row >= kWeightNormRows) return rows_fn(std::integral_constant<int, kWeightNormRows>{}, a, row);
    for (int64_t r = row; r < a.rows; ++r) rows_fn(std::integral_constant<int, 1>{}, a, r);
  });
}

}  // namespace

void CpuKernels::weight_norm(const WeightNormTensor* tensors, int64_t count) {
  count_flops(kernel_flops::weight_norm(tensors, count, false));
  for_weight_norm_groups(tensors, count, [](auto R, const WeightNormTensor& a, int64_t row) {
    const int64_t at = row * a.cols;
    weight_norm_rows<R>(a.v + at, a.g + row, a.cols, a.w + at);
  });
}

void CpuKernels::weight_norm_backward(const WeightNormTensor* tensors, int64_t count) {
  count_flops(kernel_flops::weight_norm(tensors, count, true));
  for_weight_norm_groups(tensors, count, [](auto R, const WeightNormTensor& a, int64_t row) {
    const int64_t at = row * a.cols;
    weight_norm_rows_backward<R>(a.v + at, a.g + row, a.dw + at, a.cols, a.dv + at, a.dg + row);
  });
}

void CpuKernels::mse(const float* a, const float* b, int64_t n, float* out) {
  count_flops(kernel_flops::mse(n));
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    double d = double(a[i]) - b[i];
    acc += d * d;
  }
  *out = static_cast<float>(acc / n);
}

void CpuKernels::index_add_rows_f32(const float* src, const int64_t* index, int64_t n, int64_t d, int64_t k,
                                    float* sums) {
  count_flops(kernel_flops::index_add_rows(n, d, false));
  std::fill(sums, sums + k * d, 0.f);
  for (int64_t i = 0; i < n; ++i) {
    int64_t c = index[i];
    if (c < 0 || c >= k) continue;
    for (int64_t j = 0; j < d; ++j) sums[c * d + j] += src[i * d + j];
  }
}

// Never destroyed: tensors freed during static destruction still find it.
DeviceKernels& cpu_kernels() {
  static CpuKernels* kernels = new CpuKernels();
  return *kernels;
}

}  // namespace vqddp
