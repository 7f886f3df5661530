// Optimizer steps against values computed by hand from the formulas.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "engine/cpu/parallel.h"
#include "engine/ops.h"
#include "engine/optim.h"

using namespace vqddp;

namespace {
Tensor leaf(std::vector<float> v) {
  Tensor t = from_vector(v, {static_cast<int64_t>(v.size())});
  t.set_requires_grad(true);
  return t;
}
}  // namespace

TEST_CASE("SGD with momentum follows buf = m*buf + g, p -= lr*buf") {
  Tensor p = leaf({1.f, -2.f});
  Sgd opt({p}, {.lr = 0.1f, .momentum = 0.9f});
  p.set_grad(from_vector({1.f, 2.f}, {2}));
  opt.step();  // buf = g
  CHECK(p.to_vector<float>()[0] == doctest::Approx(1.f - 0.1f * 1.f));
  CHECK(p.to_vector<float>()[1] == doctest::Approx(-2.f - 0.1f * 2.f));
  p.set_grad(from_vector({1.f, 2.f}, {2}));
  opt.step();  // buf = 0.9*g + g = 1.9 g
  CHECK(p.to_vector<float>()[0] == doctest::Approx(0.9f - 0.1f * 1.9f));
  CHECK(p.to_vector<float>()[1] == doctest::Approx(-2.2f - 0.1f * 3.8f));
}

TEST_CASE("SGD skips parameters without a gradient and applies L2 weight decay") {
  Tensor p = leaf({2.f}), q = leaf({5.f});
  Sgd opt({p, q}, {.lr = 0.5f, .weight_decay = 0.1f});
  p.set_grad(from_vector({1.f}, {1}));
  opt.step();
  CHECK(p.item<float>() == doctest::Approx(2.f - 0.5f * (1.f + 0.1f * 2.f)));
  CHECK(q.item<float>() == 5.f);
}

TEST_CASE("AdamW: first steps match the decoupled-decay formula") {
  Tensor p = leaf({1.f});
  AdamW opt({p}, {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f});
  double pv = 1.0, m = 0, v = 0;
  for (int t = 1; t <= 3; ++t) {
    double g = 0.5 * t;
    p.set_grad(from_vector({static_cast<float>(g)}, {1}));
    opt.step();
    pv -= 0.1 * 0.01 * pv;
    m = 0.9 * m + 0.1 * g;
    v = 0.999 * v + 0.001 * g * g;
    double mh = m / (1 - std::pow(0.9, t)), vh = v / (1 - std::pow(0.999, t));
    pv -= 0.1 * mh / (std::sqrt(vh) + 1e-8);
    CHECK(p.item<float>() == doctest::Approx(pv).epsilon(1e-5));
  }
  // The first Adam step moves by lr regardless of the gradient's scale.
  Tensor q = leaf({0.f});
  AdamW opt2({q}, {.lr = 0.1f, .weight_decay = 0.f});
  q.set_grad(from_vector({1e-3f}, {1}));
  opt2.step();
  CHECK(q.item<float>() == doctest::Approx(-0.1f).epsilon(1e-4));
  CHECK(opt2.state().back().first == "step.0");
  CHECK(opt2.state().back().second.item<int64_t>() == 1);
}

TEST_CASE("optimizer state restored into a fresh optimizer continues bit for bit") {
  auto grad_at = [](int t) { return from_vector({0.3f * t, -0.2f}, {2}); };
  for (bool sgd : {false, true}) {
    CAPTURE(sgd);
    auto make = [&](Tensor p) -> std::unique_ptr<Optimizer> {
      if (sgd) return std::make_unique<Sgd>(std::vector<Tensor>{p}, SgdOptions{.lr = 0.05f, .momentum = 0.9f});
      return std::make_unique<AdamW>(std::vector<Tensor>{p}, AdamWOptions{.lr = 0.05f});
    };
    Tensor straight = leaf({1.f, 2.f});
    auto opt = make(straight);
    NamedTensors saved;
    Tensor saved_p;
    for (int t = 0; t < 6; ++t) {
      if (t == 3) {
        for (auto& [n, s] : opt->state()) saved.emplace_back(n, s.clone());
        saved_p = straight.clone();
      }
      straight.set_grad(grad_at(t));
      opt->step();
    }
    // A new parameter and optimizer, loaded from the snapshot taken at t = 3.
    Tensor resumed = leaf({0.f, 0.f});
    resumed.copy_(saved_p);
    auto fresh = make(resumed);
    NamedTensors live = fresh->state();
    REQUIRE(live.size() == saved.size());
    for (size_t i = 0; i < saved.size(); ++i) {
      CHECK(live[i].first == saved[i].first);
      live[i].second.copy_(saved[i].second);
    }
    for (int t = 3; t < 6; ++t) {
      resumed.set_grad(grad_at(t));
      fresh->step();
    }
    CHECK(resumed.to_vector<float>() == straight.to_vector<float>());
  }
}

TEST_CASE("AdamW counts steps per parameter: a late parameter starts its bias correction at 1") {
  Tensor early = leaf({0.f}), late = leaf({0.f});
  AdamW opt({early, late}, {.lr = 0.1f, .weight_decay = 0.f});
  early.set_grad(from_vector({1.f}, {1}));
  opt.step();
  opt.step();
  late.set_grad(from_vector({1e-3f}, {1}));
  opt.step();
  // Its first step moves it by lr, whatever the scale of its gradient.
  CHECK(late.item<float>() == doctest::Approx(-0.1f).epsilon(1e-4));
}

TEST_CASE("clip_grad_norm scales to max_norm and returns the norm before clipping") {
  Tensor a = leaf({0.f, 0.f}), b = leaf({0.f});
  a.set_grad(from_vector({3.f, 0.f}, {2}));
  b.set_grad(from_vector({4.f}, {1}));
  CHECK(clip_grad_norm({a, b}, 1.f).item<float>() == doctest::Approx(5.f));
  CHECK(a.grad().to_vector<float>()[0] == doctest::Approx(0.6f).epsilon(1e-5));
  CHECK(b.grad().item<float>() == doctest::Approx(0.8f).epsilon(1e-5));
  CHECK(clip_grad_norm({a, b}, 10.f).item<float>() == doctest::Approx(1.f).epsilon(1e-5));
  CHECK(b.grad().item<float>() == doctest::Approx(0.8f).epsilon(1e-5));  // unchanged below the limit
}

TEST_CASE("AdamW over many tensors at once equals each tensor stepped alone, on 1 to 3 threads") {
  // The CPU splits every tensor's elements laid end to end over its
  // threads; each element must still get its own tensor's bias
  // corrections (the tensors start at different steps) and nothing else.
  const std::vector<int64_t> sizes{3, 70001, 1, 40000, 9, 25000};
  auto values = [](int64_t n, float scale, int seed) {
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.37f * static_cast<float>(i) + static_cast<float>(seed));
    return v;
  };
  const int restore = cpu_threads();
  for (int threads : {1, 2, 3}) {
    CAPTURE(threads);
    cpu_set_threads(threads);
    std::vector<Tensor> together, alone;
    for (size_t t = 0; t < sizes.size(); ++t) {
      together.push_back(leaf(values(sizes[t], 1.f, static_cast<int>(t))));
      alone.push_back(leaf(values(sizes[t], 1.f, static_cast<int>(t))));
    }
    const AdamWOptions o{.lr = 0.01f, .beta1 = 0.8f, .beta2 = 0.99f, .weight_decay = 0.05f};
    AdamW all(together, o);
    std::vector<std::unique_ptr<AdamW>> each;
    for (const Tensor& p : alone) each.push_back(std::make_unique<AdamW>(std::vector<Tensor>{p}, o));
    for (int step = 0; step < 4; ++step) {
      for (size_t t = 0; t < sizes.size(); ++t) {
        if (static_cast<int>(t % 3) > step) continue;  // no gradient yet: a late tensor starts later
        const std::vector<float> g = values(sizes[t], 0.1f * static_cast<float>(step + 1), static_cast<int>(t + 7 * step));
        together[t].set_grad(from_vector(g, {sizes[t]}));
        alone[t].set_grad(from_vector(g, {sizes[t]}));
        each[t]->step();
      }
      all.step();
    }
    for (size_t t = 0; t < sizes.size(); ++t) {
      CAPTURE(t);
      CHECK(together[t].to_vector<float>() == alone[t].to_vector<float>());
    }
  }
  cpu_set_threads(restore);
}
