#include "engine/device_plans.h"

#include <vector>

namespace vqddp {

DeviceKernels& device_of(const char* op, std::initializer_list<const Tensor*> operands) {
  const Tensor* first = nullptr;
  for (const Tensor* t : operands) {
    if (!t->defined()) continue;
    if (!first) first = t;
    VQDDP_CHECK(t->device() == first->device(), "{}: operands on different devices: {} and {}", op, first->desc(),
                t->desc());
  }
  return device_kernels(first ? first->device() : Device::cpu());
}

void check_device_indices(DeviceKernels& k, const char* op, const Tensor& index, int64_t rows, const char* what) {
  int64_t m = index.numel();
  if (m == 0) return;
  int64_t lo = 0, hi = 0;
  k.min_max_i64(static_cast<const int64_t*>(index.raw_ptr()), m, &lo, &hi);
  if (lo >= 0 && hi < rows) return;
  std::vector<int64_t> host(static_cast<size_t>(m));
  k.copy(host.data(), true, index.raw_ptr(), index.device().is_cpu(), host.size() * sizeof(int64_t));
  int64_t at = 0;
  while (host[at] >= 0 && host[at] < rows) ++at;
  VQDDP_THROW("{}: index[{}] = {} out of range for {} {}", op, at, host[at], rows, what);
}

static void check_rank(const Shape& s) {
  VQDDP_CHECK(s.size() <= static_cast<size_t>(kMaxDims), "device ops support at most {} dimensions, got shape {}",
              kMaxDims, shape_str(s));
}

// Row-major strides of `s` aligned to the last `rank` dims, 0 where s has
// size 1 or no dimension.
static void aligned_strides(const Shape& s, size_t rank, int64_t* out) {
  int64_t stride = 1;
  size_t shift = rank - s.size();
  for (size_t i = rank; i-- > 0;) {
    out[i] = 0;
    if (i < shift) continue;
    int64_t size = s[i - shift];
    if (size != 1) out[i] = stride;
    stride *= size;
  }
}

BroadcastPlan broadcast_plan(const Shape& a, const Shape& b, const Shape& out) {
  check_rank(out);
  BroadcastPlan p;
  p.ndim = static_cast<int>(out.size());
  for (size_t i = 0; i < out.size(); ++i) p.shape[i] = out[i];
  aligned_strides(a, out.size(), p.stride_a);
  aligned_strides(b, out.size(), p.stride_b);
  return p;
}

ReducePlan sum_to_plan(const Shape& in, const Shape& out, double divisor) {
  check_rank(in);
  ReducePlan p;
  p.divisor = divisor;
  size_t shift = in.size() - out.size();
  int64_t stride = 1;
  int64_t strides[kMaxDims];
  for (size_t i = in.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= in[i];
  }
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == 1) continue;  // contributes to neither side
    bool kept = i >= shift && out[i - shift] == in[i];
    if (kept) {
      p.keep_size[p.nkeep] = in[i];
      p.keep_stride[p.nkeep++] = strides[i];
    } else {
      p.red_size[p.nred] = in[i];
      p.red_stride[p.nred++] = strides[i];
    }
  }
  // Summing away only size-1 dims is still a sum, which starts from +0
  // (-0 becomes +0), so it reduces one dim of size 1: a plan that reduces
  // nothing is a sum's backward, which repeats its input bit for bit.
  if (p.nred == 0) {
    p.red_size[0] = 1;
    p.red_stride[0] = 0;
    p.nred = 1;
  }
  return p;
}

ReducePlan sum_dim_plan(int64_t outer, int64_t n, int64_t inner, double divisor) {
  ReducePlan p;
  p.divisor = divisor;
  p.nkeep = 2;
  p.keep_size[0] = outer;
  p.keep_stride[0] = n * inner;
  p.keep_size[1] = inner;
  p.keep_stride[1] = 1;
  p.nred = 1;
  p.red_size[0] = n;
  p.red_stride[0] = inner;
  return p;
}

}  // namespace vqddp
