// Step graphs on the simulated device (engine/step_graph.h): a step captured
// once and replayed computes what issuing its launches would have, bit for
// bit, and a step that is not the captured one again (another scalar,
// state carried in a new tensor, a read, an upload into an old buffer) is
// refused by name instead of replaying stale work.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "engine/device_counters.h"
#include "engine/ops.h"
#include "engine/step_graph.h"
#include "tests/engine/mlp_steps.h"

using namespace vqddp;
using vqddp::test::train_mlp;

TEST_CASE("step graph on sim: a captured step replayed equals the steps issued launch by launch, bit for bit") {
  std::vector<std::vector<float>> eager = train_mlp(Device::sim(), 9, 0);
  int64_t replays = 0;
  std::vector<std::vector<float>> graphed = train_mlp(Device::sim(), 9, 3, &replays);
  CHECK(replays == 6);  // steps 4..9 replay step 3's capture
  CHECK(graphed == eager);
  // A graph from the first step on (the optimizer's moments made in the
  // captured step itself) still matches.
  CHECK(train_mlp(Device::sim(), 6, 1) == train_mlp(Device::sim(), 6, 0));
  // SGD's rate, uploaded each step too.
  CHECK(train_mlp(Device::sim(), 9, 3, &replays, true) == train_mlp(Device::sim(), 9, 0, nullptr, true));
  CHECK(replays == 6);
}

TEST_CASE("step graph on sim: state carried in place and uploads replay; what a replay would get wrong is refused") {
  auto error_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  auto upload = [](float v) { return full({4}, v, DType::f32, Device::cpu()).to(Device::sim()); };
  SUBCASE("in place, with an upload a step: each replay adds its own step's value") {
    Tensor state = zeros({4}, DType::f32, Device::sim());
    StepGraph graph(Device::sim());
    for (int s = 1; s <= 4; ++s) {
      graph.begin_step(s);
      state.copy_(add(state, upload(static_cast<float>(s))));
      graph.end_step();
    }
    CHECK(graph.replays() == 3);
    CHECK(graph.launches() == 2);  // the add and the copy: the upload is not in the graph
    CHECK(state.to(Device::cpu()).to_vector<float>() == std::vector<float>(4, 10.f));
  }
  SUBCASE("state carried in a new tensor: the first replay names the launch") {
    Tensor state = zeros({4}, DType::f32, Device::sim());
    StepGraph graph(Device::sim());
    graph.begin_step(1);
    state = add(state, upload(1.f));
    graph.end_step();
    graph.begin_step(2);
    std::string e = error_of([&] { state = add(state, upload(1.f)); });
    graph.abandon_step();
    CHECK_MESSAGE(e.find("launch 1 of step 2 is binary with other arguments") != std::string::npos, e);
  }
  SUBCASE("a scalar that changes every step: refused (upload it)") {
    Tensor state = zeros({4}, DType::f32, Device::sim());
    StepGraph graph(Device::sim());
    graph.begin_step(1);
    state.copy_(add(state, 1.f));
    graph.end_step();
    graph.begin_step(2);
    std::string e = error_of([&] { state.copy_(add(state, 2.f)); });
    graph.abandon_step();
    CHECK_MESSAGE(e.find("with other arguments") != std::string::npos, e);
  }
  SUBCASE("a read inside the step, and an upload into a buffer made before it: refused") {
    Tensor old = zeros({4}, DType::f32, Device::sim());
    StepGraph graph(Device::sim());
    graph.begin_step(1);
    std::string e = error_of([&] { (void)old.to(Device::cpu()); });
    CHECK_MESSAGE(e.find("step 1 copies device memory to the host inside the step") != std::string::npos, e);
    e = error_of([&] { old.copy_(full({4}, 1.f, DType::f32, Device::cpu())); });
    CHECK_MESSAGE(e.find("uploads 16 bytes into a buffer made before the step") != std::string::npos, e);
    Tensor filled = zeros({4}, DType::f32, Device::sim());  // a launch of the step writes it first
    e = error_of([&] { filled.copy_(full({4}, 1.f, DType::f32, Device::cpu())); });
    CHECK_MESSAGE(e.find("uploads 16 bytes into a tensor after launch 1 of the step") != std::string::npos, e);
    graph.abandon_step();
    CHECK_FALSE(graph.captured());
  }
  SUBCASE("a step that picks its launches on the host runs once as captured, then graphing stops") {
    Tensor state = zeros({4}, DType::f32, Device::sim());
    StepGraph graph(Device::sim());
    for (int s = 1; s <= 3; ++s) {
      graph.begin_step(s);
      note_step_variant("layers", s);
      for (int k = 0; k < s; ++k) state.copy_(add(state, upload(1.f)));  // s launches pairs
      graph.end_step();
      if (s == 1) CHECK_MESSAGE(graph.stopped_because().find("(layers)") != std::string::npos, graph.stopped_because());
    }
    CHECK(graph.replays() == 0);
    CHECK(state.to(Device::cpu()).to_vector<float>() == std::vector<float>(4, 6.f));
  }
}
