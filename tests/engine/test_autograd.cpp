// Tape mechanics: accumulation, leaves, detach, no-grad per thread.
#include <doctest/doctest.h>

#include <atomic>
#include <thread>

#include "engine/autograd.h"
#include "engine/op_profile.h"
#include "engine/ops.h"

using namespace vqddp;

TEST_CASE("gradients accumulate into .grad across backward calls until zero_grad") {
  Tensor x = from_vector({1, 2, 3}, {3});
  x.set_requires_grad(true);
  sum(square(x)).backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>{2, 4, 6});
  sum(x).backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>{3, 5, 7});
  x.zero_grad();
  CHECK_FALSE(x.grad().defined());
}

TEST_CASE("a tensor used twice gets the sum of both paths") {
  Tensor x = from_vector({2}, {1});
  x.set_requires_grad(true);
  Tensor y = mul(x, x);          // x^2
  Tensor z = add(mul(y, x), y);  // x^3 + x^2
  sum(z).backward();
  CHECK(x.grad().item<float>() == 3 * 4 + 2 * 2);
}

TEST_CASE("leaves fed one gradient tensor get .grad tensors of their own, which later steps add into in place") {
  // add's backward hands the same gradient to both inputs and reshape's is a
  // view of its input's: a leaf takes a gradient without a copy only when
  // nothing else holds it, so writing one .grad never changes another's.
  for (bool through_reshape : {false, true}) {
    Tensor a = from_vector({1, 2, 3, 4}, {4}), b = from_vector({5, 6, 7, 8}, {4});
    a.set_requires_grad(true);
    b.set_requires_grad(true);
    Tensor ra = through_reshape ? reshape(reshape(a, {2, 2}), {4}) : a;
    sum(mul(add(ra, b), from_vector({1, 2, 3, 4}, {4}))).backward();
    REQUIRE(a.grad().defined());
    REQUIRE(b.grad().defined());
    CHECK_FALSE(a.grad().shares_storage(b.grad()));
    a.grad().fill_(0);
    CHECK(b.grad().to_vector<float>() == std::vector<float>{1, 2, 3, 4});
    sum(mul(add(ra, b), from_vector({1, 2, 3, 4}, {4}))).backward();
    CHECK(a.grad().to_vector<float>() == std::vector<float>{1, 2, 3, 4});
    CHECK(b.grad().to_vector<float>() == std::vector<float>{2, 4, 6, 8});
  }
}

TEST_CASE("detach and no-grad stop the tape") {
  Tensor x = from_vector({1, 2}, {2});
  x.set_requires_grad(true);
  Tensor d = x.detach();
  CHECK(d.shares_storage(x));
  CHECK_FALSE(d.requires_grad());
  CHECK_FALSE(mul(d, 2.f).requires_grad());
  {
    NoGradGuard guard;
    CHECK_FALSE(grad_enabled());
    CHECK_FALSE(mul(x, 2.f).requires_grad());
  }
  CHECK(grad_enabled());
  CHECK(mul(x, 2.f).requires_grad());
}

TEST_CASE("backward needs a one-element tensor that requires grad") {
  Tensor x = ones({2});
  x.set_requires_grad(true);
  CHECK_THROWS_WITH_AS(mul(x, 2.f).backward(), doctest::Contains("one-element"), Error);
  CHECK_THROWS_WITH_AS(sum(ones({2})).backward(), doctest::Contains("does not require grad"), Error);
  CHECK_THROWS_WITH_AS(arange(3).set_requires_grad(true), doctest::Contains("only float32"), Error);
}

TEST_CASE("only leaves can be marked trainable") {
  Tensor x = ones({2});
  x.set_requires_grad(true);
  Tensor y = mul(x, 2.f);
  CHECK_THROWS_WITH_AS(y.set_requires_grad(false), doctest::Contains("non-leaf"), Error);
}

TEST_CASE("no-grad mode is per thread: a guard in one thread leaves another recording") {
  Tensor x = ones({2});
  x.set_requires_grad(true);
  bool other_recorded = false, guarded_recorded = true;
  std::atomic<int> stage{0};
  std::thread guarded([&] {
    NoGradGuard guard;
    stage = 1;
    while (stage != 2) std::this_thread::yield();
    guarded_recorded = mul(x, 3.f).requires_grad();
  });
  std::thread other([&] {
    while (stage != 1) std::this_thread::yield();
    other_recorded = mul(x, 3.f).requires_grad();  // runs while the guard lives
    stage = 2;
  });
  guarded.join();
  other.join();
  CHECK(other_recorded);
  CHECK_FALSE(guarded_recorded);
}

TEST_CASE("a deep chain backpropagates without recursion limits") {
  Tensor x = from_vector({1}, {1});
  x.set_requires_grad(true);
  Tensor y = x;
  for (int i = 0; i < 100000; ++i) y = add(y, 0.f);
  sum(y).backward();
  CHECK(x.grad().item<float>() == 1.f);
}

TEST_CASE("backward refuses values a saved tensor lost to an in-place write") {
  Tensor w = from_vector({1, 2}, {2});
  w.set_requires_grad(true);
  Tensor x = from_vector({3, 4}, {2});
  SUBCASE("copy_ into an operand of mul") {
    Tensor loss = sum(mul(w, x));
    x.copy_(from_vector({0, 0}, {2}));
    CHECK_THROWS_WITH_AS(loss.backward(), doctest::Contains("backward of 'mul': a tensor it saved was modified in place"),
                         Error);
  }
  SUBCASE("the output of exp, which its backward reads") {
    Tensor y = vqddp::exp(w);
    Tensor loss = sum(y);
    y.fill_(0);
    CHECK_THROWS_WITH_AS(loss.backward(), doctest::Contains("backward of 'exp'"), Error);
  }
  SUBCASE("add reads no values, so writing its operand is fine") {
    Tensor loss = sum(add(w, x));
    x.fill_(7);
    loss.backward();
    CHECK(w.grad().to_vector<float>() == std::vector<float>{1, 1});
  }
}

TEST_CASE("the op profile charges each op, each backward formula and the ops a formula runs, only inside its scope") {
  Tensor a = full({64, 32}, 0.5), b = full({32, 16}, 0.25);
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  op_profile_take();  // whatever else this thread charged before
  {
    Tensor outside = sum(matmul(a, b));  // no scope: not charged
    outside.backward();
  }
  CHECK(op_profile_take().empty());
  {
    OpProfileScope scope;
    Tensor y = sum(square(matmul(a, b)));
    op_profile_mark("my part");
    y.backward();
  }
  Tensor after = square(a);  // the scope is gone: not charged
  std::vector<OpProfileEntry> table = op_profile_take();
  auto calls = [&](const std::string& name) {
    for (const OpProfileEntry& e : table)
      if (e.name == name) return e.calls;
    return int64_t{0};
  };
  CHECK(calls("matmul") == 1);
  CHECK(calls("square") == 1);
  CHECK(calls("sum") == 1);
  CHECK(calls("my part") == 1);
  CHECK(calls("matmul backward") == 1);
  CHECK(calls("square backward") == 1);
  CHECK(calls("matmul backward: matmul") == 2);  // dA and dB, charged to the formula that ran them
  double total = 0;
  for (const OpProfileEntry& e : table) total += e.seconds;
  CHECK(total > 0);
  CHECK(op_profile_table(table, 1).find("matmul backward: matmul") != std::string::npos);
  CHECK(op_profile_take().empty());
}

TEST_CASE("an op of several outputs: one backward with every output's gradient, none where none flowed") {
  // split2(x) = (2x, 3x) as one node: its backward sees both gradients at
  // once (an output nothing used arrives undefined) and runs once.
  int runs = 0;
  auto split2 = [&runs](const Tensor& x) {
    std::vector<Tensor> outs{mul(x.detach(), 2.f), mul(x.detach(), 3.f)};
    record_multi_op("split2", outs, {x}, {}, [&runs](const std::vector<Tensor>& g) -> std::vector<Tensor> {
      ++runs;
      REQUIRE(g.size() == 2);
      Tensor gx = zeros(g[0].defined() ? g[0].shape() : g[1].shape());
      if (g[0].defined()) gx = add(gx, mul(g[0], 2.f));
      if (g[1].defined()) gx = add(gx, mul(g[1], 3.f));
      return {gx};
    });
    return outs;
  };
  Tensor x = full({4}, 1.f).set_requires_grad(true);
  std::vector<Tensor> o = split2(x);
  CHECK(o[0].requires_grad());
  CHECK(o[1].requires_grad());
  // Both outputs used, the second twice: d/dx of sum(o0) + 2 sum(o1) = 2 + 6.
  add(sum(o[0]), mul(sum(o[1]), 2.f)).backward();
  CHECK(runs == 1);
  for (float v : x.grad().to_vector<float>()) CHECK(v == 8.f);
  // Only the second output used: the first arrives undefined.
  x.zero_grad();
  runs = 0;
  o = split2(x);
  sum(o[1]).backward();
  CHECK(runs == 1);
  for (float v : x.grad().to_vector<float>()) CHECK(v == 3.f);
  // Under no-grad nothing is recorded.
  NoGradGuard no_grad;
  o = split2(x);
  CHECK(!o[0].requires_grad());
}
