// A small training loop for step-graph tests (engine/step_graph.h), on sim
// (tests/engine/test_step_graph.cpp) and on a GPU (tests/cuda/test_optim.cpp).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "engine/nn.h"
#include "engine/ops.h"
#include "engine/optim.h"
#include "engine/step_graph.h"
#include "engine/core/random.h"

namespace vqddp::test {

// `steps` steps of a two-layer MLP under AdamW (or SGD with momentum) on
// `device` (sim or cuda),
// with a learning rate that changes every step, clipping, and a batch
// uploaded each step; from step `graph_from` on (0: never) each step is a
// step graph's. Returns the parameters.
inline std::vector<std::vector<float>> train_mlp(Device device, int steps, int graph_from,
                                                 int64_t* replays = nullptr, bool sgd = false) {
  Generator g(11, 0);
  Linear a(6, 8, g), b(8, 3, g);
  a.to(device);
  b.to(device);
  std::vector<Tensor> params = a.parameters();
  for (const Tensor& p : b.parameters()) params.push_back(p);
  std::unique_ptr<Optimizer> opt;
  if (sgd)
    opt = std::make_unique<Sgd>(params, SgdOptions{.lr = 0.1f, .momentum = 0.9f});
  else
    opt = std::make_unique<AdamW>(params, AdamWOptions{});
  std::optional<StepGraph> graph;
  if (graph_from > 0) graph.emplace(device);
  Generator data(5, 0);
  for (int s = 1; s <= steps; ++s) {
    Tensor host_x = rand_normal({10, 6}, data), host_y = rand_normal({10, 3}, data);
    const bool graphed = graph && s >= graph_from;
    if (graphed) graph->begin_step(s);
    Tensor x = host_x.to(device), y = host_y.to(device);
    Tensor loss = mse_loss(b.forward(relu(a.forward(x))), y);
    loss.backward();
    clip_grad_norm(params, 0.5f);
    opt->lr = (sgd ? 0.1f : 0.01f) / static_cast<float>(s);
    opt->step();
    opt->zero_grad();
    if (graphed) graph->end_step();
  }
  if (replays) *replays = graph ? graph->replays() : 0;
  std::vector<std::vector<float>> out;
  for (const Tensor& p : params) out.push_back(p.to(Device::cpu()).to_vector<float>());
  return out;
}

}  // namespace vqddp::test
