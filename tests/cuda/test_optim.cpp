// Optimizers and gradient clipping on cuda:0 against the CPU. The update
// formulas are one definition (kernel_math.h) rounded after every operation
// on both sides, so parameters and optimizer state must be BITWISE equal.
// The clipping norm sums squares in another order on the device, so it is
// compared within 1e-6 relative (and must repeat bitwise run to run).
#include <cstring>

#include "engine/optim.h"
#include "tests/cuda/gpu.h"
#include "tests/engine/mlp_steps.h"

using namespace vqddp;
using namespace vqddp::test;

namespace {

// Same shape and the same bits (so -0 vs +0 and NaN payloads count).
bool same_bits(const Tensor& a, const Tensor& b) {
  std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  return a.shape() == b.shape() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// Parameters of several sizes (one above a block, one of many blocks),
// each on the host and as an independent copy on the GPU.
struct TwinParams {
  std::vector<Tensor> cpu, gpu;
  explicit TwinParams(const std::vector<Shape>& shapes) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      Tensor p = randn(shapes[i], 10 + i);
      cpu.push_back(p.clone().set_requires_grad(true));
      gpu.push_back(p.to(kGpu).set_requires_grad(true));
    }
  }
  // The same gradients on both sides; gradients span many magnitudes so
  // rounding differences could not hide. Parameter `skip` gets none.
  void set_grads(int step, size_t skip = SIZE_MAX) {
    for (size_t i = 0; i < cpu.size(); ++i) {
      if (i == skip) continue;
      Tensor g = mul(randn(cpu[i].shape(), 100 + 10 * step + i), std::pow(10.f, static_cast<float>(step % 5) - 3.f));
      cpu[i].set_grad(g);
      gpu[i].set_grad(g.to(kGpu));
    }
  }
  void zero_grads() {
    for (Tensor& t : cpu) t.zero_grad();
    for (Tensor& t : gpu) t.zero_grad();
  }
};

void check_same_state(Optimizer& cpu, Optimizer& gpu) {
  NamedTensors sc = cpu.state(), sg = gpu.state();
  REQUIRE(sc.size() == sg.size());
  for (size_t i = 0; i < sc.size(); ++i) {
    CAPTURE(sc[i].first);
    CHECK(sg[i].first == sc[i].first);
    if (sc[i].second.dtype() == DType::i64) {
      CHECK(sg[i].second.device() == kCpu);  // step counters stay on the host
      CHECK(sg[i].second.to_vector<int64_t>() == sc[i].second.to_vector<int64_t>());
    } else {
      CHECK(sg[i].second.device() == kGpu);
      CHECK(same_bits(sg[i].second, sc[i].second));
    }
  }
}

const std::vector<Shape> kShapes{{37, 5}, {300}, {600, 1000}};

}  // namespace

TEST_CASE("SGD on the GPU equals the CPU bitwise: plain, momentum, nesterov, weight decay") {
  for (SgdOptions o : {SgdOptions{.lr = 0.05f}, SgdOptions{.lr = 0.05f, .momentum = 0.9f},
                       SgdOptions{.lr = 0.05f, .momentum = 0.9f, .nesterov = true},
                       SgdOptions{.lr = 0.05f, .momentum = 0.8f, .weight_decay = 0.01f, .nesterov = true}}) {
    CAPTURE(o.momentum);
    CAPTURE(o.nesterov);
    CAPTURE(o.weight_decay);
    TwinParams p(kShapes);
    Sgd cpu(p.cpu, o), gpu(p.gpu, o);
    for (int step = 0; step < 5; ++step) {
      CAPTURE(step);
      p.set_grads(step, step == 2 ? 1 : SIZE_MAX);  // one parameter sits a step out
      cpu.step();
      gpu.step();
      p.zero_grads();
      for (size_t i = 0; i < p.cpu.size(); ++i) CHECK(same_bits(p.gpu[i], p.cpu[i]));
    }
    check_same_state(cpu, gpu);
  }
}

TEST_CASE("AdamW on the GPU equals the CPU bitwise, per-parameter step counts included") {
  AdamWOptions o{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.05f};
  TwinParams p(kShapes);
  AdamW cpu(p.cpu, o), gpu(p.gpu, o);
  for (int step = 0; step < 6; ++step) {
    CAPTURE(step);
    p.set_grads(step, step < 2 ? 0 : SIZE_MAX);  // parameter 0 starts its bias correction late
    cpu.lr = gpu.lr = o.lr * (1.f - 0.1f * static_cast<float>(step));  // a schedule changes lr between steps
    cpu.step();
    gpu.step();
    p.zero_grads();
    for (size_t i = 0; i < p.cpu.size(); ++i) CHECK(same_bits(p.gpu[i], p.cpu[i]));
  }
  check_same_state(cpu, gpu);
}

TEST_CASE("clip_grad_norm on the GPU: the CPU's norm within 1e-6, the same scaling, reproducible bitwise") {
  for (float max_norm : {1e9f, 0.5f}) {
    CAPTURE(max_norm);
    TwinParams p(kShapes);
    p.set_grads(4, 1);  // one parameter without a gradient is skipped
    float nc = clip_grad_norm(p.cpu, max_norm).item<float>();
    float ng = clip_grad_norm(p.gpu, max_norm).item<float>();
    CHECK(std::abs(double(ng) - nc) <= 1e-6 * nc);
    CHECK_FALSE(p.gpu[1].grad().defined());
    for (size_t i : {size_t{0}, size_t{2}}) check_matches(p.gpu[i].grad(), p.cpu[i].grad(), 1e-6, 0.0);
    if (max_norm > nc) {
      for (size_t i : {size_t{0}, size_t{2}}) CHECK(same_bits(p.gpu[i].grad(), p.cpu[i].grad()));  // untouched
    }
    // The same gradients again give the same norm, bit for bit.
    TwinParams again(kShapes);
    again.set_grads(4, 1);
    CHECK(clip_grad_norm(again.gpu, max_norm).item<float>() == ng);
    CHECK(same_bits(again.gpu[2].grad(), p.gpu[2].grad()));
  }
}

// Step graphs (engine/step_graph.h) on the GPU: one CUDA graph captured at
// step 3 and replayed for every later step, the rate and bias corrections
// uploaded each step, against the same steps issued launch by launch.
TEST_CASE("a step graph on the GPU: replays of one captured CUDA graph end in the bits of the issued steps") {
  int64_t replays = 0;
  std::vector<std::vector<float>> graphed = train_mlp(kGpu, 9, 3, &replays);
  CHECK(replays == 6);
  CHECK(graphed == train_mlp(kGpu, 9, 0));
  CHECK(train_mlp(kGpu, 6, 1) == train_mlp(kGpu, 6, 0));
  CHECK(train_mlp(kGpu, 9, 3, nullptr, true) == train_mlp(kGpu, 9, 0, nullptr, true));  // SGD
}
