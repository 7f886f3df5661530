#include "train/check_ddp.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>

#include "train/trainer.h"

namespace vqddp {

namespace {

NamedTensors snapshot(const Module& m) {
  NamedTensors out;
  for (auto& [n, t] : m.named_parameters()) out.emplace_back(n, t.clone());
  for (auto& [n, t] : m.named_buffers()) out.emplace_back(n, t.clone());
  return out;
}

// snapshots[rank][step - 1]
std::vector<std::vector<NamedTensors>> run(Config cfg, const Dataset& data, int world, int64_t steps) {
  cfg.distributed.world_size = world;
  cfg.schedule.steps = steps;
  std::vector<std::vector<NamedTensors>> snaps(world);
  TrainOptions opt;
  opt.validate = false;
  opt.checkpoints = false;
  opt.print = false;
  opt.after_step = [&](int64_t, int rank, const CodecModel& model) { snaps[rank].push_back(snapshot(model)); };
  train(cfg, data, opt);
  return snaps;
}

struct Diff {
  double abs = 0, rel = 0;
  bool over = false;
};

}  // namespace

CheckDdpResult check_ddp(Config cfg, const Dataset& data, const CheckDdpOptions& o) {
  CheckDdpResult r;
  auto one = run(cfg, data, 1, o.steps)[0];
  auto many = run(cfg, data, o.world, o.steps);
  std::vector<std::string> order;
  std::map<std::string, Diff> worst;
  for (int64_t s = 0; s < o.steps; ++s) {
    for (size_t i = 0; i < one[s].size(); ++i) {
      const auto& [name, ref] = one[s][i];
      if (worst.find(name) == worst.end()) order.push_back(name);
      Diff& d = worst[name];
      for (int rank = 1; rank < o.world; ++rank) {
        const Tensor& other = many[rank][s][i].second;
        if (std::memcmp(other.raw_data(), many[0][s][i].second.raw_data(), other.numel() * dtype_size(other.dtype()))) {
          if (r.ranks_identical)
            r.first_failure = fmt::format("step {}: '{}' differs between rank 0 and rank {}", s + 1, name, rank);
          r.ranks_identical = false;
          d.over = true;
        }
      }
      const Tensor& got = many[0][s][i].second;
      for (int64_t j = 0; j < ref.numel(); ++j) {
        double a = ref.dtype() == DType::f32 ? got.data<float>()[j] : double(got.data<int64_t>()[j]);
        double b = ref.dtype() == DType::f32 ? ref.data<float>()[j] : double(ref.data<int64_t>()[j]);
        double diff = std::abs(a - b);
        d.abs = std::max(d.abs, diff);
        if (diff > 0) d.rel = std::max(d.rel, diff / std::max(std::abs(b), 1e-12));
        if (!(diff <= o.atol + o.rtol * std::abs(b))) {
          if (!d.over && r.first_failure.empty())
            r.first_failure = fmt::format("step {}: '{}'[{}] is {} on {} ranks, {} on 1 rank", s + 1, name, j, a, o.world, b);
          d.over = true;
        }
      }
      r.worst_abs = std::max(r.worst_abs, d.abs);
    }
  }
  r.passed = r.ranks_identical;
  for (auto& [_, d] : worst) r.passed &= !d.over;
  if (o.print) {
    fmt::print("check-ddp: {} steps, 1 rank vs {} ranks, tolerance |a - b| <= {} + {} |b|\n", o.steps, o.world, o.atol,
               o.rtol);
    fmt::print("{:<44} {:>12} {:>12}  {}\n", "tensor", "max abs", "max rel", "");
    for (const std::string& name : order) {
      const Diff& d = worst[name];
      fmt::print("{:<44} {:>12.3e} {:>12.3e}  {}\n", name, d.abs, d.rel, d.over ? "FAIL" : "ok");
    }
    fmt::print("ranks bitwise identical after every step: {}\n", r.ranks_identical ? "yes" : "NO");
    fmt::print("check-ddp: {}{}\n", r.passed ? "PASSED" : "FAILED", r.passed ? "" : " (" + r.first_failure + ")");
  }
  return r;
}

}  // namespace vqddp
