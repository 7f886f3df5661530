#include "tool/demo_mlp.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <numbers>

#include "engine/autograd.h"
#include "engine/cpu/blas.h"
#include "engine/nn.h"
#include "engine/ops.h"
#include "engine/optim.h"

namespace vqddp {

namespace {

// Target surface f(x, y) = sin(pi x) cos(pi y) on [-1, 1]^2: smooth, with
// enough curvature that a linear model cannot fit it (its best MSE is about
// 0.25), so a falling loss shows the hidden layers learn.
void make_batch(Generator& gen, int n, Tensor& x, Tensor& y) {
  x = rand_uniform({n, 2}, gen, -1.f, 1.f);  // (n, 2)
  y = empty({n, 1});                          // (n, 1)
  const float* px = x.data<float>();
  float* py = y.data<float>();
  for (int i = 0; i < n; ++i)
    py[i] = static_cast<float>(std::sin(std::numbers::pi * px[2 * i]) * std::cos(std::numbers::pi * px[2 * i + 1]));
}

}  // namespace

double run_mlp_demo(const DemoOptions& opt) {
  Generator init_gen(opt.seed, 0), data_gen(opt.seed, 1);
  Sequential model;
  model.add(std::make_shared<Linear>(2, opt.hidden, init_gen))
      .add(std::make_shared<Activation>([](const Tensor& t) { return gelu(t); }))
      .add(std::make_shared<Linear>(opt.hidden, opt.hidden, init_gen))
      .add(std::make_shared<Activation>([](const Tensor& t) { return gelu(t); }))
      .add(std::make_shared<Linear>(opt.hidden, 1, init_gen));
  AdamW optim(model.parameters(), {.lr = 3e-3f, .weight_decay = 1e-4f});

  Generator val_gen(opt.seed, 2);
  Tensor val_x, val_y;
  make_batch(val_gen, 4096, val_x, val_y);
  auto validate = [&] {
    NoGradGuard no_grad;
    return mse_loss(model(val_x), val_y).item<float>();
  };

  fmt::print("demo: MLP 2-{}-{}-1 fitting sin(pi x) cos(pi y); AdamW, batch {}, {} steps, BLAS core {}\n",
             opt.hidden, opt.hidden, opt.batch, opt.steps, blas_core_name());
  auto start = std::chrono::steady_clock::now();
  double val = validate();
  for (int step = 1; step <= opt.steps; ++step) {
    Tensor x, y;
    make_batch(data_gen, opt.batch, x, y);
    optim.zero_grad();
    Tensor loss = mse_loss(model(x), y);
    loss.backward();
    clip_grad_norm(model.parameters(), 1.0f);
    optim.step();
    if (step % opt.log_every == 0 || step == opt.steps) {
      val = validate();
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      fmt::print("step {:5d}/{}  train mse {:.5f}  val mse {:.5f}  {:.0f} steps/s\n", step, opt.steps,
                 loss.item<float>(), val, step / secs);
    }
  }
  return val;
}

}  // namespace vqddp
