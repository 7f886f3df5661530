#include "train/check_ddp.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "train/checkpoint.h"
#include "train/trainer.h"

namespace vqddp {

namespace {

TrainOptions quiet() {
  TrainOptions o;
  o.validate = false;
  o.checkpoints = false;
  o.print = false;
  return o;
}

struct Diff {
  double abs = 0, rel = 0;
  int64_t first_bad_step = 0;
};

}  // namespace

// check-ddp always compares thread ranks of one process, whatever backend
// the config trains with ("single" runs one rank only; "nccl" one process
// per GPU).
static Config thread_ranks(const Config& cfg, int world) {
  Config c = cfg;
  c.distributed.backend = "thread";
  c.distributed.world_size = world;
  return c;
}

CheckDdpResult check_ddp(Config cfg, const Dataset& data, const CheckDdpOptions& o) {
  CheckDdpResult r;
  cfg.schedule.steps = o.steps;
  std::filesystem::path tmp =
      std::filesystem::temp_directory_path() / fmt::format("vqddp-check-ddp-{}-{}", ::getpid(), o.world);
  std::filesystem::create_directories(tmp);
  auto state_file = [&](int64_t step) { return (tmp / fmt::format("state-{}.safetensors", step)).string(); };

  // 1 rank, whole batches: its state after every step, saved to disk so the
  // W-rank steps can start from it.
  std::vector<NamedTensors> one;
  {
    Config c = thread_ranks(cfg, 1);
    TrainOptions opt = quiet();
    opt.after_step = [&](int64_t step, int, const CodecModel& model, Optimizer& optim) {
      one.push_back(model.state_copy(Device::cpu()));  // compared on the host, also for a GPU run
      save_checkpoint(state_file(step), model, optim, step, cfg.source);
    };
    train(c, data, opt);
  }

  std::vector<std::string> order;
  std::map<std::string, Diff> worst;
  for (int64_t step = 1; step <= o.steps; ++step) {
    Config c = thread_ranks(cfg, o.world);
    TrainOptions opt = quiet();
    opt.resume = step == 1 ? "" : state_file(step - 1);
    opt.stop_at_step = step;
    std::vector<NamedTensors> ranks(o.world);
    opt.after_step = [&](int64_t, int rank, const CodecModel& model, Optimizer&) {
      ranks[rank] = model.state_copy(Device::cpu());
    };
    try {
      train(c, data, opt);
    } catch (const Error& e) {
      // Ranks that stop agreeing on their collectives (a desync, a timeout)
      // are the plainest DDP failure of all.
      r.ranks_identical = false;
      r.first_failure = fmt::format("step {}: the {} ranks failed: {}", step, o.world, e.what());
      break;
    }
    const NamedTensors& ref = one[step - 1];
    for (size_t i = 0; i < ref.size(); ++i) {
      const auto& [name, want] = ref[i];
      if (!worst.count(name)) order.push_back(name);
      Diff& d = worst[name];
      auto fail = [&](const std::string& why) {
        if (!d.first_bad_step) d.first_bad_step = step;
        if (r.first_failure.empty()) r.first_failure = fmt::format("step {}: {}", step, why);
      };
      for (int rank = 1; rank < o.world; ++rank) {
        const Tensor& other = ranks[rank][i].second;
        if (std::memcmp(other.raw_data(), ranks[0][i].second.raw_data(), other.nbytes())) {
          r.ranks_identical = false;
          fail(fmt::format("'{}' differs between rank 0 and rank {}", name, rank));
        }
      }
      const Tensor& got = ranks[0][i].second;
      for (int64_t j = 0; j < want.numel(); ++j) {
        double a = got.dtype() == DType::f32 ? got.data<float>()[j] : double(got.data<int64_t>()[j]);
        double b = want.dtype() == DType::f32 ? want.data<float>()[j] : double(want.data<int64_t>()[j]);
        double diff = std::abs(a - b);
        d.abs = std::max(d.abs, diff);
        if (diff > 0) d.rel = std::max(d.rel, diff / std::max(std::abs(b), 1e-30));
        if (!(diff <= o.atol + o.rtol * std::abs(b)))
          fail(fmt::format("'{}'[{}] is {} on {} ranks, {} on 1 rank", name, j, a, o.world, b));
      }
      r.worst_abs = std::max(r.worst_abs, d.abs);
    }
  }
  std::filesystem::remove_all(tmp);

  r.passed = r.first_failure.empty();
  if (o.print) {
    fmt::print("check-ddp: {} steps, each from the same state: 1 rank vs {} ranks, |a - b| <= {} + {} |b|\n", o.steps,
               o.world, o.atol, o.rtol);
    fmt::print("{:<44} {:>12} {:>12}  {}\n", "tensor", "max abs", "max rel", "");
    for (const std::string& name : order) {
      const Diff& d = worst[name];
      fmt::print("{:<44} {:>12.3e} {:>12.3e}  {}\n", name, d.abs, d.rel,
                 d.first_bad_step ? fmt::format("FAIL (step {})", d.first_bad_step) : "ok");
    }
    fmt::print("ranks bitwise identical after every step: {}\n", r.ranks_identical ? "yes" : "NO");
    fmt::print("check-ddp: {}{}\n", r.passed ? "PASSED" : "FAILED", r.passed ? "" : " (" + r.first_failure + ")");
  }
  return r;
}

}  // namespace vqddp
