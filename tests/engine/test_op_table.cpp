// The op table (op_table.h) on the CPU and the simulated device: every
// op's gradient against richardson_check's finite differences (tolerance
// in gradcheck.h), and sim's forward and backward with the CPU's bits. The
// GPU's run of the same table is in tests/cuda/test_ops.cpp.
#include <doctest/doctest.h>


#include "tests/engine/op_table.h"
#include "tests/engine/same_bits.h"

using namespace vqddp;
using namespace vqddp::test;

namespace {

// y = f(inputs) and every input's gradient of sum(w * y), w fixed.
struct Run {
  Tensor y;
  std::vector<Tensor> grads;
};

Run run(const OpCase& c, const std::vector<Tensor>& inputs) {
  Run r;
  r.y = c.f(inputs);
  Generator gen(4321, 0);
  Tensor w = rand_uniform(r.y.shape(), gen, 0.5f, 1.5f).to(r.y.device());
  sum(mul(r.y, w)).backward();
  for (const Tensor& x : inputs) r.grads.push_back(x.requires_grad() ? x.grad() : Tensor());
  return r;
}

}  // namespace

TEST_CASE("op table: every op's gradient on the CPU equals Richardson-extrapolated central differences") {
  std::vector<OpCase> table = op_table();
  REQUIRE(table.size() > 60);
  double worst = 0.0;
  std::string worst_case;
  for (const OpCase& c : table) {
    CAPTURE(c.name);
    GradCheckResult r = richardson_check(c.f, make_inputs(c), c.gemm_k);
    INFO(r.failure);
    CHECK(r.ok);
    CHECK(r.checked > 0);
    if (r.worst > worst) worst = r.worst, worst_case = c.name;
  }
  MESSAGE("op table: ", table.size(), " cases; largest |analytic - numeric| / tolerance ", worst, " (", worst_case,
          ")");
}

TEST_CASE("op table: the gradient check catches a mean over 24 elements whose backward divides by 23") {
  // Forward mean(x) (up to rounding), backward that of sum(x) / 23: the
  // detached part carries the forward's difference and no gradient.
  Fn wrong = [](const std::vector<Tensor>& v) {
    Tensor s = sum(v[0]);
    return add(mul(s, 1.f / 23), sub(mul(s, 1.f / 24), mul(s, 1.f / 23)).detach());
  };
  Fn right = [](const std::vector<Tensor>& v) { return mean(v[0]); };
  OpCase c{"x24", {in({24})}, right};
  GradCheckResult bad = richardson_check(wrong, make_inputs(c));
  CHECK_FALSE(bad.ok);
  CHECK(bad.worst > 10);  // not a near miss: the tolerance is far below 1/552
  MESSAGE("1/23 for 1/24: ", bad.failure);
  GradCheckResult good = richardson_check(right, make_inputs(c));
  INFO(good.failure);
  CHECK(good.ok);
  // The same mistake on a mean along a dim, and a gradient 0.1% too large
  // on a transcendental op, are caught too.
  Fn wrong_dim = [](const std::vector<Tensor>& v) {
    Tensor s = sum(v[0], 1);
    return add(mul(s, 1.f / 23), sub(mul(s, 1.f / 24), mul(s, 1.f / 23)).detach());
  };
  OpCase rows{"3x24", {in({3, 24})}, right};
  CHECK_FALSE(richardson_check(wrong_dim, make_inputs(rows)).ok);
  Fn exp_off = [](const std::vector<Tensor>& v) {
    Tensor e = vqddp::exp(v[0]);
    return add(mul(e, 1.001f), sub(e, mul(e, 1.001f)).detach());
  };
  OpCase e{"exp", {in({2, 5})}, right};
  CHECK_FALSE(richardson_check(exp_off, make_inputs(e)).ok);
  // An input no gradient reaches is a failure, not a pass.
  Fn cut = [](const std::vector<Tensor>& v) { return mean(v[0].detach()); };
  GradCheckResult none = richardson_check(cut, make_inputs(c));
  CHECK_FALSE(none.ok);
  CHECK(none.failure == "no gradient reached input 0");
}

TEST_CASE("op table: on sim every op's forward and gradients have the CPU's bits") {
  for (const OpCase& c : op_table()) {
    CAPTURE(c.name);
    std::vector<Tensor> host = make_inputs(c);
    Run cpu = run(c, inputs_on(host, Device::cpu()));
    std::vector<Tensor> on_sim = inputs_on(host, Device::sim());
    Run sim = run(c, on_sim);
    REQUIRE(sim.y.device() == Device::sim());
    CHECK(same_bits(sim.y, cpu.y));
    for (size_t k = 0; k < host.size(); ++k) {
      if (!host[k].requires_grad()) continue;
      CAPTURE(k);
      REQUIRE(sim.grads[k].defined());
      CHECK(sim.grads[k].device() == Device::sim());
      CHECK(same_bits(sim.grads[k], cpu.grads[k]));
    }
  }
}
