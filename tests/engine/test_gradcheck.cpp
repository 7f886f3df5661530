// Every op with a backward, checked against central differences
// (tolerances in gradcheck.h). Inputs keep away from kinks (relu at 0,
// clamp bounds) and domain edges (sqrt, log at 0).
#include "tests/engine/gradcheck.h"

using namespace vqddp;
using vqddp::test::check_gradient;
using vqddp::test::param;

TEST_CASE("gradient: add, sub, mul, div on equal shapes") {
  auto a = param({3, 4}, 1), b = param({3, 4}, 2, 0.5f, 2.f);
  check_gradient("add", [](auto& x) { return add(x[0], x[1]); }, {a, b});
  check_gradient("sub", [](auto& x) { return sub(x[0], x[1]); }, {a, b});
  check_gradient("mul", [](auto& x) { return mul(x[0], x[1]); }, {a, b});
  check_gradient("div", [](auto& x) { return div(x[0], x[1]); }, {a, b});
}

TEST_CASE("gradient: broadcasting a trailing row, a column and a scalar sums back to the input shape") {
  auto a = param({3, 4}, 3), row = param({4}, 4, 0.5f, 2.f), col = param({3, 1}, 5, 0.5f, 2.f), s = param({}, 6, 0.5f, 2.f);
  for (const Tensor& b : {row, col, s}) {
    check_gradient("add bcast", [](auto& x) { return add(x[0], x[1]); }, {a, b});
    check_gradient("sub bcast", [](auto& x) { return sub(x[1], x[0]); }, {a, b});
    check_gradient("mul bcast", [](auto& x) { return mul(x[1], x[0]); }, {a, b});
    check_gradient("div bcast", [](auto& x) { return div(x[0], x[1]); }, {a, b});
  }
  // Both operands broadcast: [3, 1] op [4] -> [3, 4].
  check_gradient("mul outer", [](auto& x) { return mul(x[0], x[1]); }, {col, row});
}

TEST_CASE("gradient: unary ops") {
  auto x = param({2, 5}, 7);
  auto pos = param({2, 5}, 8, 0.5f, 2.f);
  check_gradient("neg", [](auto& v) { return neg(v[0]); }, {x});
  check_gradient("square", [](auto& v) { return square(v[0]); }, {x});
  check_gradient("sqrt", [](auto& v) { return vqddp::sqrt(v[0]); }, {pos});
  check_gradient("exp", [](auto& v) { return vqddp::exp(v[0]); }, {x});
  check_gradient("log", [](auto& v) { return vqddp::log(v[0]); }, {pos});
  check_gradient("gelu", [](auto& v) { return gelu(v[0]); }, {x});
  check_gradient("tanh", [](auto& v) { return vqddp::tanh(v[0]); }, {x});
  check_gradient("sigmoid", [](auto& v) { return sigmoid(v[0]); }, {x});
  // relu and clamp: values at least 0.05 away from the kinks.
  Tensor away = from_vector({-0.9f, -0.4f, -0.1f, 0.1f, 0.3f, 0.6f, 0.8f, -0.7f, 0.45f, 0.95f}, {2, 5});
  away.set_requires_grad(true);
  check_gradient("relu", [](auto& v) { return relu(v[0]); }, {away});
  check_gradient("clamp", [](auto& v) { return clamp(v[0], -0.5f, 0.5f); }, {away});
}

TEST_CASE("gradient: sum and mean, all and along each dim") {
  auto x = param({2, 3, 4}, 9);
  check_gradient("sum", [](auto& v) { return sum(v[0]); }, {x});
  check_gradient("mean", [](auto& v) { return mean(v[0]); }, {x});
  for (int64_t d : {0, 1, 2, -1})
    for (bool keep : {false, true}) {
      check_gradient("sum dim", [=](auto& v) { return sum(v[0], d, keep); }, {x});
      check_gradient("mean dim", [=](auto& v) { return mean(v[0], d, keep); }, {x});
    }
}

TEST_CASE("gradient: matmul with every transpose combination") {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      auto a = param(ta ? Shape{4, 3} : Shape{3, 4}, 10), b = param(tb ? Shape{5, 4} : Shape{4, 5}, 11);
      check_gradient("matmul", [=](auto& v) { return matmul(v[0], v[1], ta, tb); }, {a, b});
    }
}

TEST_CASE("gradient: reshape, slice_rows, transpose, concat, index_select") {
  auto x = param({4, 3}, 12);
  check_gradient("reshape", [](auto& v) { return mul(reshape(v[0], {2, -1}), v[0].reshape({2, 6})); }, {x});
  check_gradient("slice_rows", [](auto& v) { return square(slice_rows(v[0], 1, 3)); }, {x});
  check_gradient("transpose", [](auto& v) { return square(transpose(v[0])); }, {x});
  auto t3 = param({2, 3, 4}, 13);
  check_gradient("transpose 3d", [](auto& v) { return square(transpose(v[0], 0, 2)); }, {t3});
  auto y = param({2, 3}, 14), z = param({4, 2}, 15);
  check_gradient("concat rows", [](auto& v) { return square(concat({v[0], v[1]}, 0)); }, {x, y});
  check_gradient("concat cols", [](auto& v) { return square(concat({v[0], v[1]}, 1)); }, {x, z});
  Tensor idx = from_vector(std::vector<int64_t>{3, 0, 3, 1, 3}, {5});
  check_gradient("index_select", [=](auto& v) { return square(index_select(v[0], idx)); }, {x});
}

TEST_CASE("gradient: mse_loss for both arguments") {
  auto a = param({3, 4}, 16), b = param({3, 4}, 17);
  check_gradient("mse_loss", [](auto& v) { return mse_loss(v[0], v[1]); }, {a, b});
}
