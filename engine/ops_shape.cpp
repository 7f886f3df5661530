// Shape ops: views (reshape, slice_rows) and copies (transpose, concat,
// index_select), each with its backward.
#include <algorithm>
#include <vector>

#include "engine/autograd.h"
#include "engine/device_plans.h"
#include "engine/exact_batch.h"
#include "engine/ops.h"

namespace vqddp {

namespace {

Tensor view_of(const Tensor& x, Shape shape, int64_t extra_offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = x.impl()->storage;
  impl->offset = x.impl()->offset + extra_offset;
  impl->shape = std::move(shape);
  impl->dtype = x.dtype();
  return Tensor(impl);
}

// Elements per row of the first dimension (also for tensors with 0 rows).
int64_t row_size(const Tensor& x) {
  int64_t n = 1;
  for (int64_t d = 1; d < x.dim(); ++d) n *= x.shape()[d];
  return n;
}

}  // namespace

Tensor reshape(const Tensor& x, const Shape& requested) {
  Shape shape = requested;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      VQDDP_CHECK(infer < 0, "reshape: more than one -1 in {}", shape_str(requested));
      infer = static_cast<int64_t>(i);
    } else {
      VQDDP_CHECK(shape[i] >= 0, "reshape: bad dimension in {}", shape_str(requested));
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    VQDDP_CHECK(known > 0 && x.numel() % known == 0, "reshape: cannot infer -1 in {} for {}", shape_str(requested), x.desc());
    shape[infer] = x.numel() / known;
  }
  VQDDP_CHECK(shape_numel(shape) == x.numel(), "reshape: {} has {} elements, shape {} needs {}", x.desc(), x.numel(),
              shape_str(shape), shape_numel(shape));
  Shape in_shape = x.shape();
  return record_op("reshape", view_of(x, shape, 0), {x},
                   [in_shape](const Tensor& g) -> std::vector<Tensor> { return {reshape(g, in_shape)}; });
}

Tensor slice_rows(const Tensor& x, int64_t begin, int64_t end) {
  VQDDP_CHECK(x.dim() >= 1, "slice_rows on a 0-d tensor");
  VQDDP_CHECK(0 <= begin && begin <= end && end <= x.size(0), "slice_rows [{}, {}) out of range for {}", begin, end,
              x.desc());
  Shape shape = x.shape();
  shape[0] = end - begin;
  Shape in_shape = x.shape();
  int64_t row = row_size(x);
  return record_op("slice_rows", view_of(x, shape, begin * row), {x},
                   [in_shape, begin, row](const Tensor& g) -> std::vector<Tensor> {
                     // Zeros, g, zeros: one launch, not a fill and a copy.
                     Tensor gx = empty(in_shape, DType::f32, g.device());
                     auto* to = static_cast<float*>(gx.raw_ptr());
                     const int64_t at = begin * row, n = g.numel();
                     const CopyBlock blocks[3] = {{nullptr, to, 1, at, 0, 0},
                                                  {g.raw_ptr(), to + at, 1, n, 0, 0},
                                                  {nullptr, to + at + n, 1, gx.numel() - at - n, 0, 0}};
                     device_of("slice_rows backward", {&g}).copy_blocks(blocks, 3, sizeof(float));
                     return {gx};
                   });
}

Tensor pad_last(const Tensor& x, int64_t left, int64_t right) {
  VQDDP_CHECK(x.dim() >= 1, "pad_last on a 0-d tensor");
  const int64_t len = x.shape().back(), kept = len + std::min<int64_t>(left, 0) + std::min<int64_t>(right, 0);
  VQDDP_CHECK(kept >= 0, "pad_last: padding ({}, {}) cuts more than {} has", left, right, x.desc());
  Shape shape = x.shape();
  shape.back() = kept + std::max<int64_t>(left, 0) + std::max<int64_t>(right, 0);
  const int64_t rows = shape_numel(Shape(shape.begin(), shape.end() - 1)), width = shape.back();
  Tensor out = empty(shape, x.dtype(), x.device());
  const size_t es = dtype_size(x.dtype());
  char* to = static_cast<char*>(out.raw_ptr());
  // Zeros, the kept columns, zeros: one launch.
  std::vector<CopyBlock> blocks;
  if (left > 0) blocks.push_back({nullptr, to, rows, left, 0, width});
  if (kept > 0)
    blocks.push_back({static_cast<const char*>(x.raw_ptr()) + std::max<int64_t>(-left, 0) * es,
                      to + std::max<int64_t>(left, 0) * es, rows, kept, len, width});
  if (right > 0) blocks.push_back({nullptr, to + (width - right) * es, rows, right, 0, width});
  device_of("pad_last", {&x}).copy_blocks(blocks.data(), static_cast<int64_t>(blocks.size()), es);
  return record_op("pad_last", out, {x}, [left, right](const Tensor& g) -> std::vector<Tensor> {
    return {pad_last(g, -left, -right)};
  });
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  int64_t r = x.dim();
  VQDDP_CHECK(d0 >= -r && d0 < r && d1 >= -r && d1 < r, "transpose: dims {}, {} out of range for {}", d0, d1, x.desc());
  if (d0 < 0) d0 += r;
  if (d1 < 0) d1 += r;
  if (d0 > d1) std::swap(d0, d1);
  if (d0 == d1) return record_op("transpose", x.clone(), {x}, [](const Tensor& g) -> std::vector<Tensor> { return {g}; });
  // View x as [A, n0, B, n1, C] and write [A, n1, B, n0, C].
  int64_t A = 1, B = 1, C = 1, n0 = x.shape()[d0], n1 = x.shape()[d1];
  for (int64_t d = 0; d < r; ++d) {
    if (d < d0) A *= x.shape()[d];
    if (d > d0 && d < d1) B *= x.shape()[d];
    if (d > d1) C *= x.shape()[d];
  }
  Shape shape = x.shape();
  std::swap(shape[d0], shape[d1]);
  Tensor out = empty(shape, x.dtype(), x.device());
  // Walk the output [A, n1, B, n0, C] with the source strides of x viewed
  // as [A, n0, B, n1, C].
  StridedCopyPlan p;
  p.ndim = 5;
  int64_t sizes[5] = {A, n1, B, n0, C};
  int64_t src[5] = {n0 * B * n1 * C, C, n1 * C, B * n1 * C, 1};
  int64_t dst[5] = {n1 * B * n0 * C, B * n0 * C, n0 * C, C, 1};
  for (int i = 0; i < 5; ++i) {
    p.shape[i] = sizes[i];
    p.src_stride[i] = src[i];
    p.dst_stride[i] = dst[i];
  }
  device_of("transpose", {&x}).strided_copy(x.raw_ptr(), out.raw_ptr(), dtype_size(x.dtype()), p);
  return record_op("transpose", out, {x},
                   [d0, d1](const Tensor& g) -> std::vector<Tensor> { return {transpose(g, d0, d1)}; });
}

Tensor concat(const std::vector<Tensor>& xs, int64_t dim) {
  VQDDP_CHECK(!xs.empty(), "concat of no tensors");
  const Tensor& first = xs[0];
  int64_t r = first.dim();
  VQDDP_CHECK(dim >= -r && dim < r, "concat: dim {} out of range for {}", dim, first.desc());
  if (dim < 0) dim += r;
  Shape shape = first.shape();
  shape[dim] = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    bool ok = x.dim() == r && x.dtype() == first.dtype();
    for (int64_t d = 0; ok && d < r; ++d) ok = d == dim || x.shape()[d] == first.shape()[d];
    VQDDP_CHECK(ok, "concat: input {} is {}, input 0 is {} (joining along dim {})", i, x.desc(), first.desc(), dim);
    shape[dim] += x.shape()[dim];
  }
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= shape[d];
  for (int64_t d = dim + 1; d < r; ++d) inner *= shape[d];
  for (const Tensor& x : xs) device_of("concat", {&first, &x});  // one device for all inputs
  Tensor out = empty(shape, first.dtype(), first.device());
  // Every input's columns in one multi-tensor copy (one launch per
  // kMultiTensors inputs), and likewise the backward's.
  const int64_t out_row = shape[dim] * inner;
  const size_t es = dtype_size(first.dtype());
  std::vector<int64_t> widths;
  std::vector<CopyBlock> blocks;
  for (int64_t at = 0; const Tensor& x : xs) {
    int64_t w = x.shape()[dim] * inner;
    blocks.push_back({x.raw_ptr(), static_cast<char*>(out.raw_ptr()) + at * es, outer, w, w, out_row});
    widths.push_back(w);
    at += w;
  }
  device_of("concat", {&out}).copy_blocks(blocks.data(), static_cast<int64_t>(blocks.size()), es);
  std::vector<Shape> shapes;
  for (const Tensor& x : xs) shapes.push_back(x.shape());
  return record_op("concat", out, xs, [=](const Tensor& g) -> std::vector<Tensor> {
    std::vector<Tensor> grads;
    std::vector<CopyBlock> back;
    int64_t at = 0;
    for (size_t i = 0; i < shapes.size(); ++i) {
      grads.push_back(empty(shapes[i], DType::f32, g.device()));
      back.push_back({static_cast<const char*>(g.raw_ptr()) + at * sizeof(float), grads.back().raw_ptr(), outer,
                      widths[i], out_row, widths[i]});
      at += widths[i];
    }
    device_of("concat backward", {&g}).copy_blocks(back.data(), static_cast<int64_t>(back.size()), sizeof(float));
    return grads;
  });
}

void check_index_range(const Tensor& index, int64_t rows, const char* what) {
  VQDDP_CHECK(index.dtype() == DType::i64, "{}: indices must be int64, got {}", what, index.desc());
  check_device_indices(device_of(what, {&index}), what, index.reshape({-1}), rows, "codes");
}

Tensor index_select(const Tensor& x, const Tensor& index, Indices from) {
  VQDDP_CHECK(x.dim() >= 1, "index_select on a 0-d tensor");
  VQDDP_CHECK(index.dtype() == DType::i64 && index.dim() == 1, "index_select: index must be int64 [M], got {}",
              index.desc());
  int64_t rows = x.size(0), m = index.numel(), row = row_size(x);
  Shape shape = x.shape();
  shape[0] = m;
  Tensor out = empty(shape, x.dtype(), x.device());
  size_t es = dtype_size(x.dtype());
  DeviceKernels& k = device_of("index_select", {&x, &index});
  if (from == Indices::checked) check_device_indices(k, "index_select", index, rows, "rows");
  k.gather_rows(x.raw_ptr(), static_cast<const int64_t*>(index.raw_ptr()), m, row * es, out.raw_ptr());
  if (!any_requires_grad({x, index})) return out;  // no backward: nothing to keep
  Shape in_shape = x.shape();
  Tensor idx = index.clone();  // the caller may reuse its index buffer
  // The index takes part in the batched/batch-free decision (exact_batch.h):
  // a codebook's rows picked by a batch's indices are batched.
  return record_op("index_select", out, {x, index}, [in_shape, idx, row, rows](const Tensor& g) -> std::vector<Tensor> {
    // Float sums in ascending position order on every device (the CPU's
    // historical bits, which a learnable codebook's lookup gradient and the
    // golden files pin). In an exact step, one such sum per unit.
    DeviceKernels& k = device_of("index_select backward", {&g, &idx});
    auto add_rows = [&](int64_t lo, int64_t hi, float* into) {
      k.index_add_rows_f32(static_cast<const float*>(g.raw_ptr()) + lo * row,
                           static_cast<const int64_t*>(idx.raw_ptr()) + lo, hi - lo, row, rows, into);
    };
    if (!wants_unit_partials(0)) {
      Tensor gx = empty(in_shape, DType::f32, g.device());
      add_rows(0, idx.numel(), static_cast<float*>(gx.raw_ptr()));
      return {gx, Tensor()};
    }
    std::vector<int64_t> bounds = unit_row_bounds(g, "index_select");
    int64_t units = static_cast<int64_t>(bounds.size()) - 1;
    Tensor parts = empty({units, rows * row}, DType::f32, g.device());
    for (int64_t u = 0; u < units; ++u)
      add_rows(bounds[u], bounds[u + 1], static_cast<float*>(parts.slice_rows(u, u + 1).raw_ptr()));
    Shape shape{units};
    shape.insert(shape.end(), in_shape.begin(), in_shape.end());
    return {parts.reshape(shape), Tensor()};
  });
}

void index_copy_(Tensor& dst, const Tensor& index, const Tensor& src, float scale, Indices from) {
  VQDDP_CHECK(dst.dtype() == DType::f32 && src.dtype() == DType::f32 && dst.dim() >= 1 && src.dim() == dst.dim() &&
                  index.dtype() == DType::i64 && index.dim() == 1 && src.size(0) == index.numel() &&
                  row_size(src) == row_size(dst),
              "index_copy_: destination {}, index {} and source {} do not fit", dst.desc(), index.desc(), src.desc());
  int64_t m = index.numel(), rows = dst.size(0), row = row_size(dst);
  DeviceKernels& k = device_of("index_copy_", {&dst, &index, &src});
  if (from == Indices::checked) check_device_indices(k, "index_copy_", index, rows, "rows");
  k.index_copy_rows(static_cast<const float*>(src.raw_ptr()), static_cast<const int64_t*>(index.raw_ptr()), m, row, scale,
                    static_cast<float*>(dst.raw_ptr()));
  dst.bump_version();
}

Tensor to_device(const Tensor& x, Device device) {
  VQDDP_CHECK(x.defined(), "to_device: undefined tensor");
  if (x.device() == device) return x;
  Tensor out = empty(x.shape(), x.dtype(), device);
  out.copy_(x);
  if (x.dtype() != DType::f32) return out;
  Device from = x.device();
  return record_op("to_device", out, {x}, [from](const Tensor& g) -> std::vector<Tensor> { return {to_device(g, from)}; });
}

}  // namespace vqddp
