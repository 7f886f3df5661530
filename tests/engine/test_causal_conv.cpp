// Causal convolutions (Conv1dOptions::causal, engine/ops.h) and the op
// under them, pad_last: each output sees only the past, exactly up to its
// own stride, with the bits of the plain convolution of the input padded by
// hand.
#include <doctest/doctest.h>

#include <vector>

#include "engine/autograd.h"
#include "engine/core/random.h"
#include "engine/nn_conv.h"
#include "engine/ops.h"
#include "tests/engine/causality.h"
#include "tests/engine/same_bits.h"

using namespace vqddp;
using vqddp::test::future_changed;
using vqddp::test::same_before;
using vqddp::test::same_bits;

namespace {

Tensor causal_input(const Shape& s, uint64_t seed, bool grad = false) {
  Generator g(seed, 0);
  Tensor t = rand_normal(s, g);
  t.set_requires_grad(grad);
  return t;
}

}  // namespace

TEST_CASE("pad_last pads with zeros or cuts either end of the last dimension, and its backward is its inverse") {
  Tensor x = from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(pad_last(x, 2, 1).to_vector<float>() == std::vector<float>{0, 0, 1, 2, 3, 0, 0, 0, 4, 5, 6, 0});
  CHECK(pad_last(x, 0, -1).to_vector<float>() == std::vector<float>{1, 2, 4, 5});
  CHECK(pad_last(x, -1, 2).to_vector<float>() == std::vector<float>{2, 3, 0, 0, 5, 6, 0, 0});
  CHECK(pad_last(x, -2, -1).shape() == Shape{2, 0});  // a stream's empty stretch
  CHECK(pad_last(pad_last(x, -2, -1), 1, 2).to_vector<float>() == std::vector<float>(6, 0.f));  // and padded again
  CHECK_THROWS_WITH(pad_last(x, -2, -2), doctest::Contains("pad_last: padding (-2, -2) cuts more than float32[2, 3]"));
  // d/dx sum(pad_last(x) * r) is r's entries over x's positions.
  Tensor xg = causal_input({2, 3, 5}, 1, true);
  Tensor r = causal_input({2, 3, 6}, 2);
  sum(mul(pad_last(xg, 2, -1), r)).backward();
  CHECK(same_bits(xg.grad(), pad_last(r, -2, 1)));
}

TEST_CASE("a causal conv1d is the plain one on the input padded on the left: L -> L / stride, bit for bit") {
  struct Case {
    int64_t cin, cout, k, stride, dilation, len;
  };
  for (Case c : {Case{3, 5, 7, 1, 1, 64}, Case{4, 4, 3, 1, 9, 50}, Case{2, 6, 10, 5, 1, 40}, Case{8, 16, 16, 8, 1, 64},
                 Case{3, 2, 1, 1, 1, 9}}) {
    CAPTURE(c.k);
    CAPTURE(c.stride);
    CAPTURE(c.dilation);
    Tensor x = causal_input({3, c.cin, c.len}, 3), w = causal_input({c.cout, c.cin, c.k}, 4), b = causal_input({c.cout}, 5);
    Conv1dOptions causal{.stride = c.stride, .dilation = c.dilation, .causal = true};
    Tensor y = conv1d(x, w, b, causal);
    CHECK(y.shape() == Shape{3, c.cout, c.len / c.stride});
    const int64_t left = c.dilation * (c.k - 1) - (c.stride - 1);
    CHECK(same_bits(y, conv1d(pad_last(x, left, 0), w, b, {.stride = c.stride, .dilation = c.dilation})));
    // Output t sees inputs up to (t + 1) stride - 1 and no later: a change
    // from input p on leaves outputs before p / stride as they were and
    // changes output p / stride.
    for (int64_t p : {c.len / 2, c.len / 2 + c.stride - 1, c.len - 1}) {
      CAPTURE(p);
      auto [same, differs] = same_before(y, conv1d(future_changed(x, p), w, b, causal), p / c.stride);
      CHECK(same);
      CHECK(differs);
    }
  }
}

TEST_CASE("a causal conv_transpose1d cuts the plain one's overhang: L -> L stride, each frame's samples wait for no later frame") {
  struct Case {
    int64_t cin, cout, k, stride, len;
  };
  for (Case c : {Case{5, 3, 10, 5, 9}, Case{16, 8, 16, 8, 6}, Case{4, 4, 7, 1, 11}, Case{3, 2, 4, 4, 5}}) {
    CAPTURE(c.k);
    CAPTURE(c.stride);
    Tensor x = causal_input({2, c.cin, c.len}, 6), w = causal_input({c.cin, c.cout, c.k}, 7), b = causal_input({c.cout}, 8);
    Conv1dOptions causal{.stride = c.stride, .causal = true};
    Tensor y = conv_transpose1d(x, w, b, causal);
    CHECK(y.shape() == Shape{2, c.cout, c.len * c.stride});
    Tensor plain = conv_transpose1d(x, w, b, {.stride = c.stride});
    CHECK(same_bits(y, pad_last(plain, 0, -(c.k - c.stride))));
    for (int64_t t : {int64_t{1}, c.len / 2, c.len - 1}) {
      CAPTURE(t);
      auto [same, differs] = same_before(y, conv_transpose1d(future_changed(x, t), w, b, causal), t * c.stride);
      CHECK(same);
      CHECK(differs);
    }
  }
  // The gradient flows through the cut: d/dx of the causal output is the
  // plain one's with the overhang's gradient zero.
  Tensor x = causal_input({2, 3, 4}, 9, true), w = causal_input({3, 2, 6}, 10), r = causal_input({2, 2, 12}, 11);
  sum(mul(conv_transpose1d(x, w, Tensor(), {.stride = 3, .causal = true}), r)).backward();
  Tensor xp = causal_input({2, 3, 4}, 9, true);
  sum(mul(conv_transpose1d(xp, w, Tensor(), {.stride = 3}), pad_last(r, 0, 3))).backward();
  CHECK(same_bits(x.grad(), xp.grad()));
}

TEST_CASE("a causal convolution with padding or a kernel shorter than its stride is refused, naming both") {
  Tensor x = causal_input({1, 2, 8}, 12), w = causal_input({3, 2, 3}, 13), wt = causal_input({2, 3, 3}, 14);
  CHECK_THROWS_WITH(conv1d(x, w, Tensor(), {.padding = 1, .causal = true}),
                    doctest::Contains("conv1d: a causal convolution takes no padding and a kernel at least its stride "
                                      "(kernel 3, stride 1, padding 1)"));
  CHECK_THROWS_WITH(conv1d(x, w, Tensor(), {.stride = 4, .causal = true}), doctest::Contains("(kernel 3, stride 4"));
  CHECK_THROWS_WITH(conv_transpose1d(x, wt, Tensor(), {.stride = 4, .causal = true}),
                    doctest::Contains("conv_transpose1d: a causal transposed convolution takes no padding"));
  // Their streams refuse alike (one formula, one check).
  StreamState state;
  CHECK_THROWS_WITH(conv1d_stream(x, w, Tensor(), {.padding = 1, .causal = true}, state),
                    doctest::Contains("conv1d: a causal convolution takes no padding"));
  CHECK_THROWS_WITH(conv_transpose1d_stream(x, wt, Tensor(), {.stride = 4, .causal = true}, state),
                    doctest::Contains("conv_transpose1d: a causal transposed convolution takes no padding"));
}
