// Modules: registration order, dotted names, modes, Linear's math.
#include <doctest/doctest.h>

#include "engine/autograd.h"
#include "engine/device.h"
#include "engine/ops.h"
#include "engine/optim.h"

using namespace vqddp;

namespace {
struct WithBuffer : Layer {
  Tensor scale, counts;
  explicit WithBuffer(Generator& gen) {
    scale = register_parameter("scale", ones({2}));
    counts = register_buffer("counts", zeros({2}));
    (void)gen;
  }
  Tensor forward(const Tensor& x) override { return mul(x, scale); }
};
}  // namespace

TEST_CASE("named parameters and buffers come in registration order with dotted names") {
  Generator gen(0, 0);
  Sequential net;
  net.add(std::make_shared<Linear>(3, 4, gen)).add(std::make_shared<WithBuffer>(gen)).add(std::make_shared<Linear>(4, 2, gen, false));
  std::vector<std::string> names;
  for (auto& [n, t] : net.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "1.scale", "2.weight"});
  auto buffers = net.named_buffers();
  REQUIRE(buffers.size() == 1);
  CHECK(buffers[0].first == "1.counts");
  CHECK_FALSE(buffers[0].second.requires_grad());
  for (auto& t : net.parameters()) CHECK(t.requires_grad());
}

TEST_CASE("train/eval mode propagates to submodules, also ones added later") {
  Generator gen(0, 0);
  Sequential net;
  net.add(std::make_shared<Linear>(2, 2, gen));
  net.eval();
  auto late = std::make_shared<Linear>(2, 2, gen);
  net.add(late);
  CHECK_FALSE(late->is_training());
  net.train();
  CHECK(late->is_training());
}

TEST_CASE("Linear computes x W^T + b and is initialised within +-1/sqrt(in)") {
  Generator gen(0, 0);
  Linear lin(4, 3, gen);
  for (float w : lin.weight.to_vector<float>()) CHECK(std::abs(w) <= 0.5f);
  lin.weight.copy_(from_vector({1, 0, 0, 0, 0, 1, 0, 0, 1, 1, 1, 1}, {3, 4}));
  lin.bias.copy_(from_vector({0.5f, -1, 0}, {3}));
  Tensor y = lin(from_vector({1, 2, 3, 4}, {1, 4}));
  CHECK(y.to_vector<float>() == std::vector<float>{1.5f, 1.f, 10.f});
  CHECK_THROWS_WITH_AS(lin(ones({1, 5})), doctest::Contains("expected input [N, 4]"), Error);
}

TEST_CASE("duplicate or dotted member names are refused") {
  struct Bad : Module {
    void twice() {
      register_buffer("a", zeros({1}));
      register_buffer("a", zeros({1}));
    }
    void dotted() { register_buffer("a.b", zeros({1})); }
  } bad;
  CHECK_THROWS_WITH_AS(bad.twice(), doctest::Contains("registered twice"), Error);
  CHECK_THROWS_WITH_AS(bad.dotted(), doctest::Contains("contains '.'"), Error);
}

TEST_CASE("a small MLP fits a linear target with SGD") {
  Generator gen(3, 0), data(3, 1);
  Sequential net;
  net.add(std::make_shared<Linear>(2, 8, gen)).add(std::make_shared<Activation>([](const Tensor& t) { return vqddp::tanh(t); }))
      .add(std::make_shared<Linear>(8, 1, gen));
  Sgd opt(net.parameters(), {.lr = 0.1f, .momentum = 0.9f});
  Tensor x = rand_uniform({64, 2}, data, -1, 1);
  Tensor y = sum(mul(x, from_vector({0.5f, -0.3f}, {2})), 1, true);
  float first = 0, last = 0;
  for (int i = 0; i < 200; ++i) {
    opt.zero_grad();
    Tensor loss = mse_loss(net(x), y);
    loss.backward();
    opt.step();
    (i == 0 ? first : last) = loss.item<float>();
  }
  CHECK(last < first * 0.05f);
}

TEST_CASE("Module::to the CPU changes nothing; to a missing device is an error that moves nothing") {
  Generator gen(1, 0);
  Linear lin(3, 2, gen);
  Tensor held = lin.weight;  // a handle taken before the move
  lin.weight.set_grad(ones({2, 3}));
  lin.to(Device::cpu());
  CHECK(lin.weight.shares_storage(held));
  CHECK(lin.weight.grad().defined());
  Device missing = Device::cuda(cuda_device_count());
  CHECK_THROWS_WITH_AS(lin.to(missing), doctest::Contains(missing.str().c_str()), Error);
  CHECK(lin.weight.device().is_cpu());
  CHECK(lin.weight.shares_storage(held));
}

TEST_CASE("updates_state: training mode and grad mode together") {
  Generator gen(1, 0);
  Linear lin(3, 2, gen);
  CHECK(lin.updates_state());
  {
    NoGradGuard no_grad;
    CHECK_FALSE(lin.updates_state());
  }
  lin.eval();
  CHECK_FALSE(lin.updates_state());
}
