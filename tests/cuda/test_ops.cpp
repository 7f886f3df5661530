// Every engine op on cuda:0 against the CPU reference, forward and
// backward, with the error bound each one is allowed:
//   exact (0):     + - * / (IEEE on both), neg, square, sqrt, relu, clamp,
//                  copies (transpose, concat, slices, index_select, to),
//                  leaky_relu, abs, unfold and fold (one formula in
//                  engine/conv_plan.h; fold sums in double in a fixed tap
//                  order, so forward and backward are exact too)
//   rtol 1e-6:     exp, log, tanh, sigmoid, gelu, elu, silu (CUDA's libm is
//                  within 2 ulp, glibc within 1), sums and means (double
//                  accumulation in a different order, rounded once)
//   rtol 1e-4:     matmul (cuBLAS and OpenBLAS sum K products in different
//                  orders: error ~ sqrt(K) eps |a||b|), atol 1e-4
//   exact forward, gradients rtol 1e-4 atol 1e-4: matmul's forward (the
//                  fixed-order GEMM) and conv1d, conv_transpose1d, conv2d,
//                  conv_transpose2d (that GEMM, unfold/fold, an exact bias
//                  add); their backward is cuBLAS vs OpenBLAS
// The op table (tests/engine/op_table.h: every op with a backward, on the
// small shapes of the CPU's finite-difference checks) runs here with those
// bounds; the cases below add the GPU's own concerns: shapes across its
// blocks and tiles, long rows, edge shapes, reproducibility.
#include <cstring>

#include "tests/engine/gradcheck.h"
#include "tests/engine/op_table.h"
#include "engine/autograd.h"
#include "engine/conv_plan.h"
#include "engine/device.h"
#include "engine/core/random.h"
#include "tests/cuda/gpu.h"

using namespace vqddp;
using namespace vqddp::test;

namespace {

// f on CPU inputs and on their GPU copies; forward and every input's
// gradient (of sum(w * f)) compared within rtol/atol.
void compare(const char* name, const std::function<Tensor(const std::vector<Tensor>&)>& f, std::vector<Tensor> cpu,
             double rtol, double atol = 0.0) {
  std::string op = name;  // CAPTURE of a const char* would log the pointer
  CAPTURE(op);
  std::vector<Tensor> gpu;
  for (Tensor& t : cpu) {
    // Fresh leaves: the caller's tensors may carry a gradient of an earlier compare.
    t = t.detach();
    t.set_requires_grad(true);
    gpu.push_back(t.detach().to(kGpu).set_requires_grad(true));
  }
  Tensor yc = f(cpu), yg = f(gpu);
  check_matches(yg, yc, rtol, atol);
  Tensor w = randn(yc.shape(), 5);
  sum(mul(yc, w)).backward();
  sum(mul(yg, w.to(kGpu))).backward();
  for (size_t i = 0; i < cpu.size(); ++i) {
    CAPTURE(i);
    REQUIRE(gpu[i].grad().defined());
    check_matches(gpu[i].grad(), cpu[i].grad(), std::max(rtol, 1e-6), std::max(atol, 1e-6));
  }
}

}  // namespace

TEST_CASE("tensors move between host and device unchanged") {
  Tensor x = randn({5, 7}, 1);
  Tensor g = x.to(kGpu);
  CHECK(g.device() == kGpu);
  CHECK(g.to_vector<float>() == x.to_vector<float>());
  CHECK(g.clone().to(kCpu).to_vector<float>() == x.to_vector<float>());
  Tensor i = from_vector(std::vector<int64_t>{3, -1, 7}, {3}).to(kGpu);
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{3, -1, 7});
  CHECK(zeros({4}, DType::f64, kGpu).to_vector<double>() == std::vector<double>(4, 0.0));
  CHECK(full({1}, 2.5, DType::f32, kGpu).item<float>() == 2.5f);
  CHECK(full({3}, 2.5, DType::f32, kGpu).to_vector<float>() == std::vector<float>(3, 2.5f));
  // copy_ in every direction writes into the existing storage.
  Tensor dst = zeros({5, 7}, DType::f32, kGpu);
  dst.copy_(x);
  CHECK(dst.to_vector<float>() == x.to_vector<float>());
  // Host access to device memory is an error, not a crash.
  CHECK_THROWS_WITH_AS(g.data<float>(), doctest::Contains("cuda:0"), Error);
}

TEST_CASE("elementwise ops match the CPU exactly, the exponential family too; gelu within 1e-6") {
  Tensor a = randn({33, 17}, 1), b = randn({33, 17}, 2), row = randn({17}, 3), col = randn({33, 1}, 4);
  Tensor pos = add(square(randn({33, 17}, 6)), 0.1f);
  using V = std::vector<Tensor>;
  compare("add", [](const V& v) { return add(v[0], v[1]); }, {a, b}, 0);
  compare("sub row", [](const V& v) { return sub(v[0], v[1]); }, {a, row}, 0);
  compare("mul col", [](const V& v) { return mul(v[0], v[1]); }, {a, col}, 0);
  compare("div", [](const V& v) { return div(v[0], v[1]); }, {a, pos}, 0);
  compare("scalar", [](const V& v) { return mul(add(v[0], 2.f), 0.5f); }, {a}, 0);
  compare("neg square", [](const V& v) { return neg(square(v[0])); }, {a}, 0);
  compare("sqrt", [](const V& v) { return sqrt(v[0]); }, {pos}, 0);
  compare("relu", [](const V& v) { return relu(v[0]); }, {a}, 0);
  compare("clamp", [](const V& v) { return clamp(v[0], -0.5f, 0.7f); }, {a}, 0);
  compare("exp", [](const V& v) { return exp(v[0]); }, {a}, 0);
  compare("log", [](const V& v) { return log(v[0]); }, {pos}, 0);
  compare("tanh", [](const V& v) { return tanh(v[0]); }, {a}, 0);
  compare("sigmoid", [](const V& v) { return sigmoid(v[0]); }, {a}, 0);
  compare("gelu", [](const V& v) { return gelu(v[0]); }, {a}, 1e-6, 1e-7);
  compare("leaky_relu", [](const V& v) { return leaky_relu(v[0], 0.2f); }, {a}, 0);
  compare("abs", [](const V& v) { return abs(v[0]); }, {a}, 0);
  compare("elu", [](const V& v) { return elu(v[0], 0.7f); }, {a}, 0);
  compare("silu", [](const V& v) { return silu(v[0]); }, {a}, 0);
}

TEST_CASE("reductions and losses match the CPU within 1e-6") {
  Tensor a = randn({40, 30, 3}, 7), b = randn({40, 30, 3}, 8);
  using V = std::vector<Tensor>;
  compare("sum", [](const V& v) { return sum(v[0]); }, {a}, 1e-6, 1e-6);
  compare("mean", [](const V& v) { return mean(v[0]); }, {a}, 1e-6, 1e-6);
  compare("sum dim 0", [](const V& v) { return sum(v[0], 0); }, {a}, 1e-6, 1e-6);
  compare("sum dim 1 keepdim", [](const V& v) { return sum(v[0], 1, true); }, {a}, 1e-6, 1e-6);
  compare("mean dim -1", [](const V& v) { return mean(v[0], -1); }, {a}, 1e-6, 1e-6);
  compare("mse", [](const V& v) { return mse_loss(v[0], v[1]); }, {a, b}, 1e-6, 1e-6);
  // Large reductions take the block-per-output kernel.
  Tensor big = randn({3, 5000}, 9);
  compare("sum dim 1 of long rows", [](const V& v) { return sum(v[0], 1); }, {big}, 1e-6, 1e-5);
}

TEST_CASE("op table: every op on the GPU has the CPU's forward bits (within 1e-6 where not exact) and gradients") {
  // Forward: the CPU's bits for exact_on_devices, else rtol 1e-6 (libm,
  // double sums in another order). Gradients: rtol 1e-6 atol 1e-6, or
  // 1e-4 for the ops with a GEMM (cuBLAS vs OpenBLAS in backward).
  for (const OpCase& c : op_table()) {
    CAPTURE(c.name);
    std::vector<Tensor> host = make_inputs(c);
    std::vector<Tensor> cpu = inputs_on(host, kCpu), gpu = inputs_on(host, kGpu);
    Tensor yc = c.f(cpu), yg = c.f(gpu);
    if (c.exact_on_devices) {
      REQUIRE(yg.device() == kGpu);
      REQUIRE(yg.shape() == yc.shape());
      std::vector<float> g = yg.to_vector<float>(), h = yc.to_vector<float>();
      CHECK(std::memcmp(g.data(), h.data(), g.size() * sizeof(float)) == 0);
    } else {
      check_matches(yg, yc, 1e-6, 1e-7);
    }
    Tensor w = randn(yc.shape(), 5);
    sum(mul(yc, w)).backward();
    sum(mul(yg, w.to(kGpu))).backward();
    const double tol = c.gemm_k > 0 ? 1e-4 : 1e-6;
    for (size_t k = 0; k < host.size(); ++k) {
      if (!host[k].requires_grad()) continue;
      CAPTURE(k);
      REQUIRE(gpu[k].grad().defined());
      check_matches(gpu[k].grad(), cpu[k].grad(), tol, tol);
    }
  }
}

TEST_CASE("argmin and argmax match the CPU, ties to the lowest index, NaN never chosen") {
  Tensor x = from_vector({3, 1, 1, 2, NAN, 5, NAN, 5, NAN, NAN, NAN, NAN}, {3, 4});
  CHECK(argmin(x.to(kGpu)).to_vector<int64_t>() == argmin(x).to_vector<int64_t>());
  CHECK(argmax(x.to(kGpu)).to_vector<int64_t>() == argmax(x).to_vector<int64_t>());
  CHECK(argmin(x).to_vector<int64_t>() == std::vector<int64_t>{1, 1, 0});
  Tensor r = randn({257, 1000}, 10);
  CHECK(argmin(r.to(kGpu)).to_vector<int64_t>() == argmin(r).to_vector<int64_t>());
  CHECK(argmax(r.to(kGpu)).to_vector<int64_t>() == argmax(r).to_vector<int64_t>());
}

TEST_CASE("forward matmul on the GPU has the CPU's bits, every transpose combination and edge shape") {
  // Both compute each element as one fma chain over k ascending
  // (engine/cpu/fixed_gemm.h), so equal bits are the contract, not a tolerance. Shapes
  // cross the GPU's 128-wide tiles and 8-deep k steps and the CPU's blocks.
  for (auto [m, n, k] : {std::array<int64_t, 3>{45, 33, 70}, {1, 257, 13}, {300, 129, 301}, {129, 1, 7}})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        CAPTURE(m);
        CAPTURE(n);
        CAPTURE(k);
        CAPTURE(ta);
        CAPTURE(tb);
        Tensor a = randn(ta ? Shape{k, m} : Shape{m, k}, 11), b = randn(tb ? Shape{n, k} : Shape{k, n}, 12);
        CHECK(matmul(a.to(kGpu), b.to(kGpu), ta, tb).to_vector<float>() == matmul(a, b, ta, tb).to_vector<float>());
      }
}

TEST_CASE("matmul's backward on the GPU (cuBLAS) matches the CPU's (OpenBLAS) within 1e-4") {
  using V = std::vector<Tensor>;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      CAPTURE(ta);
      CAPTURE(tb);
      Tensor a = randn(ta ? Shape{70, 45} : Shape{45, 70}, 11), b = randn(tb ? Shape{33, 70} : Shape{70, 33}, 12);
      compare("matmul", [=](const V& v) { return matmul(v[0], v[1], ta, tb); }, {a, b}, 1e-4, 1e-4);
    }
}

TEST_CASE("convolutions on the GPU: forward has the CPU's bits, gradients within 1e-4") {
  using V = std::vector<Tensor>;
  auto opts = [](std::array<int64_t, 2> stride, std::array<int64_t, 2> pad, std::array<int64_t, 2> dil,
                 std::array<int64_t, 2> out_pad = {0, 0}, int64_t groups = 1) {
    ConvOptions o;
    o.stride = stride, o.padding = pad, o.dilation = dil, o.output_padding = out_pad, o.groups = groups;
    return o;
  };
  // unfold and fold: one formula on both devices (conv_plan.h), each the
  // other's backward, so forward and gradient are exact.
  Tensor img = randn({2, 3, 9, 11}, 20);
  struct Geometry {
    int64_t kh, kw;
    ConvOptions o;
  };
  for (const Geometry& geo : {Geometry{3, 3, opts({1, 1}, {1, 1}, {1, 1})}, Geometry{2, 3, opts({2, 3}, {0, 2}, {1, 2})},
                              Geometry{3, 2, opts({3, 1}, {2, 0}, {2, 1})}}) {
    int64_t kh = geo.kh, kw = geo.kw;
    ConvOptions o = geo.o;
    CAPTURE(kh);
    CAPTURE(kw);
    compare("unfold", [=](const V& v) { return unfold(v[0], kh, kw, o); }, {img}, 0);
    Shape shape = img.shape();
    Tensor cols = unfold(img, kh, kw, o);  // only its shape matters
    compare("fold", [=](const V& v) { return fold(v[0], shape, kh, kw, o); }, {randn(cols.shape(), 21)}, 0);
  }

  // The convolutions: compare() holds forward and gradients to 1e-4; the
  // forward is then checked for equal bits on its own.
  auto check = [](const char* name, const std::function<Tensor(const V&)>& f, const V& in) {
    compare(name, f, in, 1e-4, 1e-4);
    std::string op = name;
    CAPTURE(op);
    V gpu;
    for (const Tensor& t : in) gpu.push_back(t.detach().to(kGpu));
    V cpu;
    for (const Tensor& t : in) cpu.push_back(t.detach());
    check_matches(f(gpu), f(cpu), 0, 0);
  };
  Conv1dOptions c1;
  c1.stride = 2, c1.padding = 3, c1.dilation = 2;
  check("conv1d", [=](const V& v) { return conv1d(v[0], v[1], v[2], c1); },
        {randn({3, 4, 37}, 22), randn({6, 4, 5}, 23), randn({6}, 24)});
  Conv1dOptions c1g = c1;
  c1g.groups = 2;
  check("conv1d groups 2", [=](const V& v) { return conv1d(v[0], v[1], v[2], c1g); },
        {randn({3, 4, 37}, 25), randn({6, 2, 5}, 26), randn({6}, 27)});
  Conv1dOptions t1;
  t1.stride = 3, t1.padding = 2, t1.dilation = 1, t1.output_padding = 2, t1.groups = 2;
  check("conv_transpose1d groups 2 output_padding 2",
        [=](const V& v) { return conv_transpose1d(v[0], v[1], v[2], t1); },
        {randn({3, 4, 13}, 28), randn({4, 3, 6}, 29), randn({6}, 30)});
  Conv1dOptions t1b;
  t1b.stride = 5, t1b.padding = 3, t1b.output_padding = 1;
  check("conv_transpose1d no bias", [=](const V& v) { return conv_transpose1d(v[0], v[1], Tensor(), t1b); },
        {randn({2, 8, 9}, 31), randn({8, 4, 10}, 32)});
  ConvOptions c2 = opts({2, 1}, {1, 2}, {1, 2});
  check("conv2d", [=](const V& v) { return conv2d(v[0], v[1], v[2], c2); },
        {randn({2, 3, 12, 10}, 33), randn({5, 3, 4, 3}, 34), randn({5}, 35)});
  ConvOptions t2 = opts({2, 3}, {1, 0}, {1, 1}, {1, 2}, 1);
  check("conv_transpose2d output_padding", [=](const V& v) { return conv_transpose2d(v[0], v[1], v[2], t2); },
        {randn({2, 4, 6, 5}, 36), randn({4, 3, 4, 3}, 37), randn({3}, 38)});
  ConvOptions t2g = opts({2, 2}, {1, 1}, {1, 1}, {0, 0}, 2);
  check("conv_transpose2d groups 2", [=](const V& v) { return conv_transpose2d(v[0], v[1], v[2], t2g); },
        {randn({2, 4, 7, 7}, 39), randn({4, 3, 4, 4}, 40), randn({6}, 41)});
}

TEST_CASE("the columnless convolution kernels have the CPU's bits: forward, input and per-sample weight and bias gradients") {
  // DeviceKernels::conv_fixed, conv_fixed_data and conv_fixed_weight: the
  // CPU runs the column path, the GPU conv_plan.h's per-element chains.
  struct Geometry {
    int64_t sh, sw, ph, pw, dh, dw;
  };
  for (const Geometry& geo : {Geometry{1, 1, 0, 0, 1, 1}, Geometry{2, 3, 1, 2, 1, 2}, Geometry{3, 2, 2, 0, 2, 3},
                              Geometry{2, 2, 3, 4, 1, 1}}) {
    ConvPlan p;
    p.n = 3, p.c = 4, p.h = 9, p.w = 14, p.kh = 3, p.kw = 4;
    p.sh = geo.sh, p.sw = geo.sw, p.ph = geo.ph, p.pw = geo.pw, p.dh = geo.dh, p.dw = geo.dw;
    p.oh = conv_output_size(p.h, p.kh, p.sh, p.ph, p.dh);
    p.ow = conv_output_size(p.w, p.kw, p.sw, p.pw, p.dw);
    const int64_t cout = 6, pos = p.oh * p.ow;
    Tensor x = randn({p.n, p.c, p.h, p.w}, 60), w = randn({cout, p.col_width()}, 61);
    Tensor g = randn({p.n, cout, pos}, 62), b = randn({cout}, 63), bc = randn({p.c}, 64);
    auto run = [&](Device d) {
      Tensor xd = x.to(d), wd = w.to(d), gd = g.to(d), bd = b.to(d), bcd = bc.to(d);
      Tensor y = empty({p.n, cout, pos}, DType::f32, d), dx = empty(x.shape(), DType::f32, d),
             dw = empty({p.n, cout, p.col_width()}, DType::f32, d), db = empty({p.n, cout}, DType::f32, d);
      DeviceKernels& k = device_kernels(d);
      auto F = [](const Tensor& t) { return static_cast<float*>(t.raw_ptr()); };
      k.conv_fixed(F(xd), F(wd), F(bd), cout, F(y), p);
      k.conv_fixed_data(F(gd), F(wd), F(bcd), cout, F(dx), p);
      k.conv_fixed_weight(F(xd), F(gd), cout, F(dw), F(db), p);
      return std::vector<Tensor>{y, dx, dw, db};
    };
    std::vector<Tensor> gpu = run(kGpu), cpu = run(kCpu);
    CAPTURE(geo.sw);
    for (size_t i = 0; i < gpu.size(); ++i) check_matches(gpu[i], cpu[i], 0, 0);
  }
}

TEST_CASE("shape ops are exact copies on the GPU") {
  Tensor a = randn({4, 5, 6}, 13), b = randn({4, 2, 6}, 14);
  using V = std::vector<Tensor>;
  compare("transpose 0 2", [](const V& v) { return transpose(v[0], 0, 2); }, {a}, 0);
  compare("transpose 1 2", [](const V& v) { return transpose(v[0], 1, 2); }, {a}, 0);
  compare("concat dim 1", [](const V& v) { return concat({v[0], v[1]}, 1); }, {a, b}, 0);
  compare("slice rows", [](const V& v) { return v[0].slice_rows(1, 3); }, {a}, 0);
  compare("reshape", [](const V& v) { return reshape(v[0], {20, -1}); }, {a}, 0);
  Tensor idx = from_vector(std::vector<int64_t>{3, 0, 3, 3, 1}, {5});
  // Repeated indices: the backward scatter-adds (deterministically) on the GPU.
  compare("index_select", [idx](const V& v) { return index_select(v[0], idx.to(v[0].device())); }, {a}, 0, 1e-6);
  Tensor bad = from_vector(std::vector<int64_t>{0, 4}, {2}).to(kGpu);
  CHECK_THROWS_WITH_AS(index_select(a.to(kGpu), bad), doctest::Contains("out of range"), Error);
  CHECK_THROWS_WITH_AS(add(a, a.to(kGpu)), doctest::Contains("different devices"), Error);
}

TEST_CASE("finite-difference gradient checks run on the GPU") {
  // check_gradient's function moves its inputs to the GPU and its output
  // back (to_device is differentiable), so forward, backward and every
  // finite difference run there.
  auto on_gpu = [](Fn f) {
    return [f](const std::vector<Tensor>& in) {
      std::vector<Tensor> g;
      for (const Tensor& t : in) g.push_back(t.to(kGpu));
      return f(g).to(kCpu);
    };
  };
  Generator gen(3, 0);
  check_gradient("gpu mlp", on_gpu([](const std::vector<Tensor>& v) {
                   return sum(tanh(add(matmul(v[0], v[1]), v[2])), 1);
                 }),
                 {rand_normal({6, 5}, gen).set_requires_grad(true), rand_normal({5, 4}, gen).set_requires_grad(true),
                  rand_normal({4}, gen).set_requires_grad(true)});
  check_gradient("gpu normalise", on_gpu([](const std::vector<Tensor>& v) {
                   return div(v[0], sqrt(sum(square(v[0]), 1, true)));
                 }),
                 {rand_normal({5, 3}, gen).set_requires_grad(true)});
  Tensor idx = from_vector(std::vector<int64_t>{1, 1, 0, 2}, {4});
  check_gradient("gpu gather", on_gpu([idx](const std::vector<Tensor>& v) {
                   return gelu(index_select(v[0], idx.to(kGpu)));
                 }),
                 {rand_normal({3, 4}, gen).set_requires_grad(true)});
}

TEST_CASE("a module moved to the GPU computes what it computed on the CPU") {
  Generator gen(1, 0);
  Linear lin(4, 3, gen);
  Tensor x = randn({2, 4}, 15);
  Tensor y_cpu = lin.forward(x);
  lin.to(kGpu);
  CHECK(lin.weight.device() == kGpu);
  check_matches(lin.forward(x.to(kGpu)), y_cpu, 1e-5, 1e-6);
}

TEST_CASE("device results are bitwise reproducible run to run") {
  // Many different values scatter-added into few rows (most into row 2):
  // float atomics would give order-dependent sums here.
  Tensor a = randn({300, 64}, 16), w = randn({3000, 64}, 17);
  std::vector<int64_t> idx(3000);
  for (int64_t i = 0; i < 3000; ++i) idx[i] = i % 3 == 0 ? (i * 7) % 300 : 2;
  auto run = [&] {
    Tensor x = a.to(kGpu).set_requires_grad(true);
    Tensor y = index_select(x, from_vector(idx, {3000}).to(kGpu));
    sum(mul(y, w.to(kGpu))).backward();
    return std::make_pair(sum(matmul(x, x, false, true), 0).to_vector<float>(), x.grad().to_vector<float>());
  };
  auto first = run();
  CHECK(run() == first);
  CHECK(run() == first);
}
