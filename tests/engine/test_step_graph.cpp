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
  SUBCASE("a step that picks its launches on the host: each choice issued once, captured, then replayed") {
    Tensor state = zeros({4}, DType::f32, Device::sim());
    StepGraph graph(Device::sim());
    const std::vector<int> layers = {1, 2, 3, 1, 2, 3, 2, 1, 3};
    for (size_t step = 0; step < layers.size(); ++step) {
      const int s = layers[step];
      graph.begin_step(static_cast<int64_t>(step) + 1);
      state.copy_(add(state, upload(10.f)));  // before the choice: one segment for all
      note_step_variant("layers", s);
      for (int k = 0; k < s; ++k) state.copy_(add(state, upload(1.f)));  // s launch pairs
      graph.end_step();
      CHECK(graph.stopped_because() == "");
    }
    CHECK(graph.graphs() == 4);    // before the choice, and after each of its 3 values
    CHECK(graph.replays() == 3);   // steps 7-9 (steps 1-3 made each choice first, 4-6 captured it)
    CHECK(graph.launches() == 8);  // step 9: the pair before the choice, then 3 pairs
    CHECK(state.to(Device::cpu()).to_vector<float>() == std::vector<float>(4, 108.f));
  }
  SUBCASE("a choice that replays another launch sequence than its capture: refused by name") {
    Tensor state = zeros({4}, DType::f32, Device::sim());
    StepGraph graph(Device::sim());
    for (int step = 1; step <= 2; ++step) {  // issued, then captured
      graph.begin_step(step);
      note_step_variant("layers", 1);
      state.copy_(add(state, upload(1.f)));
      graph.end_step();
    }
    graph.begin_step(3);
    note_step_variant("layers", 1);
    std::string e = error_of([&] {
      state.copy_(add(state, upload(1.f)));
      state.copy_(add(state, upload(1.f)));
    });
    graph.abandon_step();
    CHECK_MESSAGE(e.find("step 3 allocated more than the captured step (2 blocks)") != std::string::npos, e);
  }
}

namespace {

template <class T>
uint64_t signature_of(const T& v) {
  LaunchSignature s;
  add_to_signature(s, v);
  return s.value();
}

// Each of `members` changed alone changes T's signature (its fields() list
// reaches the hash), from a plan with every member set.
template <class T, class... M>
void every_member_signs(T plan, M T::*... members) {
  const uint64_t base = signature_of(plan);
  auto bump = [](auto& m) {
    using V = std::remove_reference_t<decltype(m)>;
    if constexpr (std::is_pointer_v<V>)  // by address: void* has no arithmetic
      m = reinterpret_cast<V>(reinterpret_cast<uintptr_t>(m) + 1);
    else if constexpr (std::is_enum_v<V>)
      m = static_cast<V>(static_cast<int>(m) + 1);
    else
      m = static_cast<V>(m + 1);
  };
  int index = 0;
  auto check = [&](auto member) {
    T changed = plan;
    bump(changed.*member);
    CHECK_MESSAGE(signature_of(changed) != base, "member ", index, " is not in the signature");
    ++index;
  };
  (check(members), ...);
}

}  // namespace

// The plans' field lists (engine/device.h's BroadcastPlan::fields): every
// member a kernel reads moves the launch signature a replay compares; the
// optimizer rates a kernel reads from its uploaded scalars do not. (A
// member added to a plan and not to its list does not compile: checked by
// hand, ConvPlan with a `groups` member fails with "only 14 names provided
// for structured binding".)
TEST_CASE("launch signatures: every field of every plan, and nothing a kernel does not read") {
  float f[4] = {};
  ConvPlan conv{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
  every_member_signs(conv, &ConvPlan::n, &ConvPlan::c, &ConvPlan::h, &ConvPlan::w, &ConvPlan::kh, &ConvPlan::kw,
                     &ConvPlan::sh, &ConvPlan::sw, &ConvPlan::ph, &ConvPlan::pw, &ConvPlan::dh, &ConvPlan::dw,
                     &ConvPlan::oh, &ConvPlan::ow);
  every_member_signs(GemmBatch{2, 3, 4, 5}, &GemmBatch::count, &GemmBatch::stride_a, &GemmBatch::stride_b,
                     &GemmBatch::stride_c);
  every_member_signs(UnaryFn{UnaryFn::Op::clamp, -1.f, 1.f}, &UnaryFn::op, &UnaryFn::low, &UnaryFn::high);
  every_member_signs(CopyBlock{f, f, 1, 2, 3, 4}, &CopyBlock::src, &CopyBlock::dst, &CopyBlock::rows,
                     &CopyBlock::width, &CopyBlock::src_row, &CopyBlock::dst_row);
  every_member_signs(UnitSumBlock{f, f, 2, 3}, &UnitSumBlock::in, &UnitSumBlock::out, &UnitSumBlock::units,
                     &UnitSumBlock::n);
  every_member_signs(AdamWTensor{f, f, f, f, 4, 5}, &AdamWTensor::p, &AdamWTensor::g, &AdamWTensor::m,
                     &AdamWTensor::v, &AdamWTensor::n, &AdamWTensor::scalar);
  every_member_signs(WeightNormTensor{f, f, f, f, f, f, 2, 3}, &WeightNormTensor::v, &WeightNormTensor::g,
                     &WeightNormTensor::w, &WeightNormTensor::dw, &WeightNormTensor::dv, &WeightNormTensor::dg,
                     &WeightNormTensor::rows, &WeightNormTensor::cols);
  SgdStep sgd{0.1f, 0.9f, 0.01f, true, true, f};
  every_member_signs(sgd, &SgdStep::momentum, &SgdStep::weight_decay, &SgdStep::scalars);
  AdamWStep adamw{0.1f, 0.9f, 0.99f, 1e-8f, 0.01f, 0.5f, 0.7f, f};
  every_member_signs(adamw, &AdamWStep::beta1, &AdamWStep::beta2, &AdamWStep::eps, &AdamWStep::weight_decay,
                     &AdamWStep::scalars);
  // Flags flip rather than count up.
  SgdStep flipped = sgd;
  flipped.nesterov = false;
  CHECK(signature_of(flipped) != signature_of(sgd));
  flipped = sgd;
  flipped.first = false;
  CHECK(signature_of(flipped) != signature_of(sgd));
  // The rates travel in `scalars`, uploaded each step: not in the signature.
  SgdStep other_rate = sgd;
  other_rate.lr = 0.2f;
  CHECK(signature_of(other_rate) == signature_of(sgd));
  AdamWStep other_corrections = adamw;
  other_corrections.lr = 0.2f;
  other_corrections.c1 = 0.6f;
  other_corrections.sqrt_c2 = 0.8f;
  CHECK(signature_of(other_corrections) == signature_of(adamw));
  // Array plans: the dimensions in use, each array's entry.
  BroadcastPlan b;
  b.ndim = 2;
  b.shape[0] = 3, b.shape[1] = 4, b.stride_a[1] = 1, b.stride_b[0] = 4;
  for (auto change : {+[](BroadcastPlan& p) { ++p.shape[1]; }, +[](BroadcastPlan& p) { ++p.stride_a[0]; },
                      +[](BroadcastPlan& p) { ++p.stride_b[1]; }}) {
    BroadcastPlan changed = b;
    change(changed);
    CHECK(signature_of(changed) != signature_of(b));
  }
  BroadcastPlan unused = b;
  unused.shape[5] = 9;  // beyond ndim: not read
  CHECK(signature_of(unused) == signature_of(b));
  ReducePlan r;
  r.nkeep = 1, r.nred = 1, r.keep_size[0] = 2, r.red_size[0] = 3, r.divisor = 3.0;
  ReducePlan r2 = r;
  r2.divisor = 2.0;
  CHECK(signature_of(r2) != signature_of(r));
  r2 = r;
  r2.red_stride[0] = 5;
  CHECK(signature_of(r2) != signature_of(r));
  StridedCopyPlan c;
  c.ndim = 1, c.shape[0] = 4, c.src_stride[0] = 1, c.dst_stride[0] = 1;
  StridedCopyPlan c2 = c;
  c2.dst_stride[0] = 2;
  CHECK(signature_of(c2) != signature_of(c));
}
