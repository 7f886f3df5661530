// The op table: every engine op with a backward, one case per line, run by
// tests/engine/test_op_table.cpp (cpu: forward and backward against
// richardson_check's finite differences, gradcheck.h; sim: the CPU's bits)
// and tests/cuda/test_ops.cpp (cuda: the CPU's bits or within 1e-6, and
// the gradients within the GPU suite's tolerances). A new op joins every
// device's checks by one line in op_table(); tests/comm/test_op_table_exact.cpp
// runs every case inside an exact step too (InStep says how).
//
// Inputs keep away from kinks (relu at 0, clamp bounds, elu and
// leaky_relu at 0: at least 0.05, more than the step h = 2^-7) and domain
// edges (sqrt, log and divisors on [0.5, 2)).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/nn_conv.h"
#include "engine/ops.h"
#include "engine/core/random.h"
#include "tests/engine/gradcheck.h"

namespace vqddp::test {

// One operand of a case: float32 uniform in [low, high) of `shape`, or a
// fixed tensor (an index tensor, values placed away from a kink).
struct Input {
  Shape shape;
  float low = -1.f, high = 1.f;
  bool requires_grad = true;
  Tensor fixed;  // when defined: used as is (on the host), shape/low/high unused
};

// How a case runs inside an exact step (engine/exact_batch.h): the inputs
// in `batched` carry the examples along dimension 0 (`rows_per_example`
// rows each; the test tiles them to more examples), the others
// are parameters, batch-free leaves whose gradient is a sum over the batch
// taken by units. `per_example_output`: the output's dimension 0 runs over
// the examples too, so each rank weights its own rows of it; otherwise each
// rank's output is already a sum over its examples (sum, a product
// contracting them). With no batched input (an op that mixes the rows
// across examples: mean over them, slices, transposes), the case runs on
// parameters alone and a batched column weights its output per example, so
// its gradient still crosses the exact step's reduction.
struct InStep {
  std::vector<size_t> batched{0};
  bool per_example_output = true;
  int64_t rows_per_example = 1;
};

struct OpCase {
  std::string name;
  std::vector<Input> inputs;
  Fn f;  // device-agnostic: every operand arrives on the device under test
  // Forward bits equal on every device. False where the GPU may differ
  // within 1e-6 relative: libm in double (gelu, erf, atan, tan) and double
  // accumulation in another order (sum, mean, their users). The
  // exponential family (exp, log, tanh, sigmoid, elu, silu) is
  // kernel_math.h's own: the same bits.
  bool exact_on_devices = true;
  // K of a float32 GEMM under the op (matmul, the convolutions; 0 for
  // none): raises the evaluation noise of richardson_check, and its
  // backward is BLAS (cuBLAS on the GPU: gradients within 1e-4 there).
  int64_t gemm_k = 0;
  InStep step = {};
};

inline Input in(Shape shape, float low = -1.f, float high = 1.f) { return {std::move(shape), low, high, true, Tensor()}; }
inline Input positive_input(Shape shape) { return {std::move(shape), 0.5f, 2.f, true, Tensor()}; }
inline Input fixed(Tensor t, bool requires_grad) { return {t.shape(), 0.f, 0.f, requires_grad, t}; }

// Host tensors of a case's inputs: seeded by the case's name and the
// input's position, so a case's values do not depend on the table's order.
inline std::vector<Tensor> make_inputs(const OpCase& c) {
  uint64_t seed = 1469598103934665603ull;  // FNV-1a of the name
  for (unsigned char ch : c.name) seed = (seed ^ ch) * 1099511628211ull;
  std::vector<Tensor> out;
  for (size_t k = 0; k < c.inputs.size(); ++k) {
    const Input& in = c.inputs[k];
    Tensor t;
    if (in.fixed.defined()) {
      t = in.fixed.clone();
    } else {
      Generator gen(seed, k);
      t = rand_uniform(in.shape, gen, in.low, in.high);
    }
    if (in.requires_grad) t.set_requires_grad(true);
    out.push_back(t);
  }
  return out;
}

// The same values on `device` as fresh leaves.
inline std::vector<Tensor> inputs_on(const std::vector<Tensor>& host, Device device) {
  std::vector<Tensor> out;
  for (const Tensor& t : host) {
    Tensor d = t.detach().to(device);
    if (d.shares_storage(t)) d = d.clone();
    if (t.requires_grad()) d.set_requires_grad(true);
    out.push_back(d);
  }
  return out;
}

inline std::vector<OpCase> op_table() {
  using V = std::vector<Tensor>;
  std::vector<OpCase> t;
  // Values at least 0.05 away from the kinks of relu (0) and clamp (+-0.5).
  Tensor away = from_vector({-0.9f, -0.4f, -0.1f, 0.1f, 0.3f, 0.6f, 0.8f, -0.7f, 0.45f, 0.95f}, {2, 5});
  // ... and of elu, leaky_relu, abs (0), on a wider range.
  Tensor away_wide = from_vector({-1.9f, -0.4f, -0.1f, 0.1f, 0.3f, 0.6f, 1.8f, -0.7f, 0.45f, 0.95f}, {2, 5});
  Tensor idx = from_vector(std::vector<int64_t>{3, 0, 3, 1, 3}, {5});  // repeated rows: backward scatter-adds
  auto o2 = [](int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t groups,
               int64_t oph = 0, int64_t opw = 0) {
    ConvOptions o;
    o.stride = {sh, sw}, o.padding = {ph, pw}, o.dilation = {dh, dw}, o.output_padding = {oph, opw}, o.groups = groups;
    return o;
  };
  // Sets the last case's exact-step roles (InStep).
  auto in_step = [&t](std::vector<size_t> batched, bool per_example_output = true) {
    t.back().step = InStep{std::move(batched), per_example_output};
  };
  auto o1 = [](int64_t stride, int64_t pad, int64_t dil, int64_t groups, int64_t out_pad = 0) {
    return Conv1dOptions{stride, pad, dil, out_pad, groups};
  };

  // ---- binary, equal shapes, broadcasting (a row, a column, a scalar, both operands)
  t.push_back({"add", {in({3, 4}), positive_input({3, 4})}, [](const V& v) { return add(v[0], v[1]); }});
  in_step({0, 1});
  t.push_back({"sub", {in({3, 4}), positive_input({3, 4})}, [](const V& v) { return sub(v[0], v[1]); }});
  in_step({0, 1});
  t.push_back({"mul", {in({3, 4}), positive_input({3, 4})}, [](const V& v) { return mul(v[0], v[1]); }});
  in_step({0, 1});
  t.push_back({"div", {in({3, 4}), positive_input({3, 4})}, [](const V& v) { return div(v[0], v[1]); }});
  in_step({0, 1});
  // A column has a value per row: batched with them. A row or a scalar is
  // a parameter broadcast over the batch.
  for (const auto& [what, shape] : {std::pair<const char*, Shape>{"row", {4}}, {"col", {3, 1}}, {"scalar", {}}}) {
    std::string b = std::string(" bcast ") + what;
    const InStep step = shape.size() == 2 ? InStep{{0, 1}} : InStep{};
    t.push_back({"add" + b, {in({3, 4}), positive_input(shape)}, [](const V& v) { return add(v[0], v[1]); }, true, 0, step});
    t.push_back({"sub" + b, {in({3, 4}), positive_input(shape)}, [](const V& v) { return sub(v[1], v[0]); }, true, 0, step});
    t.push_back({"mul" + b, {in({3, 4}), positive_input(shape)}, [](const V& v) { return mul(v[1], v[0]); }, true, 0, step});
    t.push_back({"div" + b, {in({3, 4}), positive_input(shape)}, [](const V& v) { return div(v[0], v[1]); }, true, 0, step});
  }
  t.push_back({"mul outer [3,1]x[4]", {positive_input({3, 1}), positive_input({4})}, [](const V& v) { return mul(v[0], v[1]); }});
  t.push_back({"scalar add, mul", {in({3, 4})}, [](const V& v) { return mul(add(v[0], 2.f), 0.5f); }});

  // ---- unary
  t.push_back({"neg", {in({2, 5})}, [](const V& v) { return neg(v[0]); }});
  t.push_back({"square", {in({2, 5})}, [](const V& v) { return square(v[0]); }});
  t.push_back({"sqrt", {positive_input({2, 5})}, [](const V& v) { return vqddp::sqrt(v[0]); }});
  t.push_back({"exp", {in({2, 5})}, [](const V& v) { return vqddp::exp(v[0]); }});
  t.push_back({"log", {positive_input({2, 5})}, [](const V& v) { return vqddp::log(v[0]); }});
  t.push_back({"gelu", {in({2, 5})}, [](const V& v) { return gelu(v[0]); }, false});
  t.push_back({"tanh", {in({2, 5})}, [](const V& v) { return vqddp::tanh(v[0]); }});
  t.push_back({"sigmoid", {in({2, 5})}, [](const V& v) { return sigmoid(v[0]); }});
  t.push_back({"relu", {fixed(away, true)}, [](const V& v) { return relu(v[0]); }});
  t.push_back({"clamp", {fixed(away, true)}, [](const V& v) { return clamp(v[0], -0.5f, 0.5f); }});
  t.push_back({"elu", {fixed(away_wide, true)}, [](const V& v) { return elu(v[0], 0.7f); }});
  t.push_back({"leaky_relu", {fixed(away_wide, true)}, [](const V& v) { return leaky_relu(v[0], 0.2f); }});
  t.push_back({"silu", {fixed(away_wide, true)}, [](const V& v) { return silu(v[0]); }});
  t.push_back({"abs", {fixed(away_wide, true)}, [](const V& v) { return vqddp::abs(v[0]); }});
  // In double, rounded: the same bits on every device but for a double
  // result next to a float midpoint, so within 1e-6 there.
  t.push_back({"erf", {in({2, 5})}, [](const V& v) { return vqddp::erf(v[0]); }, false});
  t.push_back({"atan", {in({2, 5})}, [](const V& v) { return vqddp::atan(v[0]); }, false});
  t.push_back({"tan", {in({2, 5})}, [](const V& v) { return vqddp::tan(v[0]); }, false});
  // sign: a step function away from 0; times x so the gradient check sees a slope (d/dx x sign(x) = sign(x)).
  t.push_back({"sign", {fixed(away_wide, true)}, [](const V& v) { return mul(v[0], vqddp::sign(v[0])); }});
  // round: a step function, gradient 0 (values at least 0.05 from a half).
  t.push_back({"round", {fixed(from_vector({-1.3f, -0.8f, -0.2f, 0.1f, 0.4f, 0.6f, 1.2f, 1.9f}, {2, 4}), true)},
               [](const V& v) { return add(vqddp::round(v[0]), v[0]); }});

  // ---- reductions: all, and along each dim with and without keepdim
  t.push_back({"sum", {in({2, 3, 4})}, [](const V& v) { return sum(v[0]); }, false});
  in_step({0}, false);
  t.push_back({"mean", {in({2, 3, 4})}, [](const V& v) { return mean(v[0]); }, false});
  in_step({});
  for (int64_t d : {0, 1, 2, -1})
    for (bool keep : {false, true}) {
      std::string at = " dim " + std::to_string(d) + (keep ? " keepdim" : "");
      t.push_back({"sum" + at, {in({2, 3, 4})}, [=](const V& v) { return sum(v[0], d, keep); }, false});
      if (d == 0) in_step({0}, false);
      t.push_back({"mean" + at, {in({2, 3, 4})}, [=](const V& v) { return mean(v[0], d, keep); }, false});
      if (d == 0) in_step({});
    }
  t.push_back({"mse_loss", {in({3, 4}), in({3, 4})}, [](const V& v) { return mse_loss(v[0], v[1]); }, false});
  in_step({});

  // ---- row-wise compositions (max_last inside softmax_rows)
  t.push_back({"softmax_rows", {in({3, 5}, -2.f, 2.f)}, [](const V& v) { return softmax_rows(v[0]); }, false});
  t.push_back({"entropy_rows", {in({3, 5}, 0.05f, 0.9f)}, [](const V& v) { return entropy_rows(v[0]); }, false});
  t.push_back({"l2_normalize_rows", {in({3, 4})}, [](const V& v) { return l2_normalize_rows(v[0]); }, false});
  // The LayerNorm module, its weight and bias taken from the case's inputs.
  t.push_back({"LayerNorm", {in({3, 5}), in({5}), in({5})}, [](const V& v) {
                 LayerNorm norm(5);
                 norm.weight = v[1];
                 norm.bias = v[2];
                 return norm.forward(v[0]);
               }, false});

  // ---- matmul, every transpose combination (K = 4)
  // a^T b contracts the examples (both batched); a^T b^T would need b's
  // columns split by example: parameters alone.
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      t.push_back({std::string("matmul") + (ta ? " ta" : "") + (tb ? " tb" : ""),
                   {in(ta ? Shape{4, 3} : Shape{3, 4}), in(tb ? Shape{5, 4} : Shape{4, 5})},
                   [=](const V& v) { return matmul(v[0], v[1], ta, tb); }, true, 4,
                   !ta ? InStep{} : tb ? InStep{{}, true} : InStep{{0, 1}, false}});

  // ---- shape ops (squared after, so the gradient is not all ones)
  // reshape: two rows of 3 to one of 6 (in an exact step, an example is two rows).
  t.push_back({"reshape", {in({4, 3})}, [](const V& v) { return mul(reshape(v[0], {-1, 6}), v[0].reshape({-1, 6})); }});
  t.back().step.rows_per_example = 2;
  t.push_back({"slice_rows", {in({4, 3})}, [](const V& v) { return square(slice_rows(v[0], 1, 3)); }});
  in_step({});
  t.push_back({"transpose", {in({4, 3})}, [](const V& v) { return square(transpose(v[0])); }});
  in_step({});
  t.push_back({"transpose 3d 0 2", {in({2, 3, 4})}, [](const V& v) { return square(transpose(v[0], 0, 2)); }});
  in_step({});
  t.push_back({"concat rows", {in({4, 3}), in({2, 3})}, [](const V& v) { return square(concat({v[0], v[1]}, 0)); }});
  in_step({});
  t.push_back({"concat cols", {in({4, 3}), in({4, 2})}, [](const V& v) { return square(concat({v[0], v[1]}, 1)); }});
  in_step({0, 1});
  // Each row padded on the left and cut on the right (a causal
  // convolution's padding), and the other way round.
  t.push_back({"pad_last", {in({4, 3})}, [](const V& v) { return square(pad_last(v[0], 2, -1)); }});
  in_step({0});
  t.push_back({"pad_last cut left pad right", {in({4, 3})}, [](const V& v) { return square(pad_last(v[0], -1, 2)); }});
  in_step({0});
  // A table's rows picked by a batch's indices: the embedding lookup.
  t.push_back({"index_select", {in({4, 3}), fixed(idx, false)},
               [](const V& v) { return square(index_select(v[0], v[1])); }});
  in_step({1});

  // ---- convolutions (K = C_in / groups x kernel taps) and weight_norm
  t.push_back({"conv1d stride 2 padding 2 dilation 2 groups 2", {in({2, 4, 9}), in({4, 2, 3}), in({4})},
               [=](const V& v) { return conv1d(v[0], v[1], v[2], o1(2, 2, 2, 2)); }, true, 2 * 3});
  // Stride 1, one group: the main job's convolutions, which the CPU runs
  // without an im2col buffer (fixed_conv).
  t.push_back({"conv1d stride 1 padding 3", {in({2, 3, 10}), in({4, 3, 7}), in({4})},
               [=](const V& v) { return conv1d(v[0], v[1], v[2], o1(1, 3, 1, 1)); }, true, 3 * 7});
  t.push_back({"conv1d stride 1 dilation 3 no bias", {in({2, 3, 12}), in({2, 3, 3})},
               [=](const V& v) { return conv1d(v[0], v[1], Tensor(), o1(1, 3, 3, 1)); }, true, 3 * 3});
  t.push_back({"conv_transpose1d stride 1 padding 1", {in({2, 3, 8}), in({3, 2, 3}), in({2})},
               [=](const V& v) { return conv_transpose1d(v[0], v[1], v[2], o1(1, 1, 1, 1)); }, true, 3 * 3});
  t.push_back({"conv_transpose1d stride 2 padding 1 output_padding 1 groups 2", {in({2, 4, 4}), in({4, 3, 4}), in({6})},
               [=](const V& v) { return conv_transpose1d(v[0], v[1], v[2], o1(2, 1, 1, 2, 1)); }, true, 2 * 4});
  // Causal (model.causal's layers): padded on the left, the overhang cut.
  auto causal = [](Conv1dOptions o) {
    o.causal = true;
    return o;
  };
  t.push_back({"conv1d causal stride 2 dilation 1", {in({2, 3, 8}), in({4, 3, 4}), in({4})},
               [=](const V& v) { return conv1d(v[0], v[1], v[2], causal(o1(2, 0, 1, 1))); }, true, 3 * 4});
  t.push_back({"conv1d causal stride 1 dilation 3", {in({2, 3, 9}), in({2, 3, 3}), in({2})},
               [=](const V& v) { return conv1d(v[0], v[1], v[2], causal(o1(1, 0, 3, 1))); }, true, 3 * 3});
  t.push_back({"conv_transpose1d causal stride 2", {in({2, 3, 4}), in({3, 2, 4}), in({2})},
               [=](const V& v) { return conv_transpose1d(v[0], v[1], v[2], causal(o1(2, 0, 1, 1))); }, true, 3 * 4});
  t.push_back({"conv2d stride (2, 1) padding 1 dilation (1, 2)", {in({2, 2, 5, 6}), in({3, 2, 3, 3}), in({3})},
               [=](const V& v) { return conv2d(v[0], v[1], v[2], o2(2, 1, 1, 1, 1, 2, 1)); }, true, 2 * 9});
  // The adversarial discriminators' kernels (train/discriminators.h): a
  // period discriminator's (5, 1) striding 3 down the time axis, an STFT
  // discriminator's (9, 3)-like kernel striding over frequency with a
  // dilation over time.
  t.push_back({"conv2d kernel (5, 1) stride (3, 1) padding (2, 0)", {in({2, 2, 8, 3}), in({3, 2, 5, 1}), in({3})},
               [=](const V& v) { return conv2d(v[0], v[1], v[2], o2(3, 1, 2, 0, 1, 1, 1)); }, true, 2 * 5});
  t.push_back({"conv2d kernel (3, 2) stride (2, 1) padding (1, 2) dilation (1, 2)",
               {in({2, 2, 6, 5}), in({3, 2, 3, 2}), in({3})},
               [=](const V& v) { return conv2d(v[0], v[1], v[2], o2(2, 1, 1, 2, 1, 2, 1)); }, true, 2 * 6});
  t.push_back({"conv_transpose2d stride 2 padding 1", {in({2, 2, 3, 3}), in({2, 3, 4, 4}), in({3})},
               [=](const V& v) { return conv_transpose2d(v[0], v[1], v[2], o2(2, 2, 1, 1, 1, 1, 1)); }, true, 2 * 16});
  // unfold and fold: each the other's backward, one formula on every device
  // (conv_plan.h; fold sums overlapping taps in double).
  ConvOptions uo = o2(2, 1, 1, 0, 1, 2, 1);
  Shape image{2, 3, 5, 6};
  Shape cols = unfold(zeros(image), 3, 2, uo).shape();
  t.push_back({"unfold", {in(image)}, [=](const V& v) { return square(unfold(v[0], 3, 2, uo)); }});
  // fold's image count follows its rows (an exact step's shard).
  const int64_t positions = cols[0] / image[0];
  t.push_back({"fold", {in(cols)}, [=](const V& v) {
                 Shape im = image;
                 im[0] = v[0].size(0) / positions;
                 return square(fold(v[0], im, 3, 2, uo));
               }});
  t.back().step.rows_per_example = positions;
  t.push_back({"weight_norm", {in({3, 2, 4}), in({3})}, [](const V& v) { return weight_norm(v[0], v[1]); }});
  in_step({});
  return t;
}

}  // namespace vqddp::test
