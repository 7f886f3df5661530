// The shape plans the device kernels run on (engine/device_plans.h), checked
// on the CPU: a host loop that walks each plan exactly as the CUDA kernels
// do (mixed-radix offsets) must reproduce the CPU ops. This covers the GPU
// path's index math on machines without a GPU.
#include <doctest/doctest.h>

#include "engine/device.h"
#include "engine/device_plans.h"
#include "engine/ops.h"
#include "engine/core/random.h"

using namespace vqddp;

namespace {

int64_t offset(const int64_t* size, const int64_t* stride, int n, int64_t i) {
  int64_t off = 0;
  for (int d = n - 1; d >= 0; --d) {
    off += (i % size[d]) * stride[d];
    i /= size[d];
  }
  return off;
}

// What reduce_block_kernel / reduce_thread_kernel compute (in ascending order).
std::vector<float> run_reduce(const Tensor& x, const ReducePlan& p) {
  int64_t outputs = 1, reduced = 1;
  for (int d = 0; d < p.nkeep; ++d) outputs *= p.keep_size[d];
  for (int d = 0; d < p.nred; ++d) reduced *= p.red_size[d];
  const float* px = x.data<float>();
  std::vector<float> out(outputs);
  for (int64_t o = 0; o < outputs; ++o) {
    double acc = 0;
    int64_t base = offset(p.keep_size, p.keep_stride, p.nkeep, o);
    for (int64_t r = 0; r < reduced; ++r) acc += px[base + offset(p.red_size, p.red_stride, p.nred, r)];
    out[o] = static_cast<float>(acc / p.divisor);
  }
  return out;
}

// What binary_kernel computes.
std::vector<float> run_binary(BinaryOp op, const Tensor& a, const Tensor& b, const BroadcastPlan& p) {
  int64_t n = 1;
  for (int d = 0; d < p.ndim; ++d) n *= p.shape[d];
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i)
    out[i] = apply_binary(op, a.data<float>()[offset(p.shape, p.stride_a, p.ndim, i)],
                          b.data<float>()[offset(p.shape, p.stride_b, p.ndim, i)]);
  return out;
}

Tensor normal_tensor(const Shape& s, uint64_t stream) {
  Generator g(5, stream);
  return rand_normal(s, g);
}

}  // namespace

TEST_CASE("broadcast plans reproduce the CPU's broadcasting") {
  Tensor a = normal_tensor({4, 3, 5}, 1);
  for (Shape bs : {Shape{5}, Shape{3, 1}, Shape{4, 1, 5}, Shape{}, Shape{1, 3, 1}, Shape{4, 3, 5}}) {
    CAPTURE(shape_str(bs));
    Tensor b = normal_tensor(bs, 2);
    Shape out = broadcast_shape(a.shape(), bs);
    CHECK(run_binary(BinaryOp::sub, a, b, broadcast_plan(a.shape(), bs, out)) == sub(a, b).to_vector<float>());
    CHECK(run_binary(BinaryOp::div, b, a, broadcast_plan(bs, a.shape(), out)) == div(b, a).to_vector<float>());
  }
}

TEST_CASE("reduce plans reproduce sum_to_shape and sums along a dimension") {
  Tensor g = normal_tensor({4, 3, 5}, 3);
  for (Shape to : {Shape{5}, Shape{3, 1}, Shape{4, 1, 5}, Shape{}, Shape{1, 3, 1}, Shape{4, 3, 5}}) {
    CAPTURE(shape_str(to));
    CHECK(run_reduce(g, sum_to_plan(g.shape(), to, 1.0)) == sum_to_shape(g, to).to_vector<float>());
  }
  CHECK(run_reduce(g, sum_dim_plan(4, 3, 5, 1.0)) == sum(g, 1).to_vector<float>());
  CHECK(run_reduce(g, sum_dim_plan(12, 5, 1, 5.0)) == mean(g, 2).to_vector<float>());
  CHECK(run_reduce(g, sum_dim_plan(1, 60, 1, 1.0)) == std::vector<float>{sum(g).item<float>()});
  // Enough outputs for the CPU's side-by-side chains (8 at a time, then
  // the rest): rows of a bias gradient, and kept dims walked by strides.
  Tensor h = normal_tensor({3, 19, 37}, 4);
  CHECK(run_reduce(h, sum_dim_plan(57, 37, 1, 1.0)) == sum(h, 2).to_vector<float>());
  for (Shape to : {Shape{1, 19, 1}, Shape{19, 1}, Shape{3, 19, 1}}) {
    CAPTURE(shape_str(to));
    CHECK(run_reduce(h, sum_to_plan(h.shape(), to, 1.0)) == sum_to_shape(h, to).to_vector<float>());
  }
}

TEST_CASE("a device this machine does not have is an error that names it") {
  Device missing = Device::cuda(cuda_device_count());  // one past the last GPU (cuda:0 without any)
  CHECK_THROWS_WITH_AS(zeros({2}, DType::f32, missing), doctest::Contains(missing.str().c_str()), Error);
  CHECK_THROWS_WITH_AS(normal_tensor({2}, 1).to(missing), doctest::Contains(missing.str().c_str()), Error);
}
