#include "tool/check_ddp.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <span>

#include "comm/backends.h"
#include "engine/ops.h"
#include "train/checkpoint.h"
#include "engine/core/count_limits.h"
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

// What one rank holds after a step, on the host.
struct Snapshot {
  NamedTensors state;   // buffers: quantizer state, compared bit for bit
  NamedTensors grads;   // the all-reduced gradient of every parameter, before the optimizer step
  NamedTensors params;  // parameters after the step
};

NamedTensors host_copies(const NamedTensors& tensors) { return copies_on(tensors, Device::cpu()); }

NamedTensors host_gradients(const CodecModel& model) {
  NamedTensors grads;
  for (const auto& [name, p] : model.named_parameters())
    // DDP's all-reduce defines every gradient; zeros if one ever is not.
    grads.emplace_back(name, p.grad().defined() ? p.grad() : zeros(p.shape(), DType::f32, p.device()));
  return host_copies(grads);
}

// Every trained part's parameters, in the parts' order, each name under its
// part's prefix: the codec's as they are, then a GAN's discriminators'
// ("discriminator.*").
NamedTensors all_parameters(std::span<const TrainedPart> parts) {
  NamedTensors out;
  for (const TrainedPart& part : parts)
    for (auto& [n, t] : part.module.named_parameters()) out.emplace_back(part.prefix + n, t);
  return host_copies(out);
}

// The three kinds of tensors, in the order they are reported.
enum Kind { kState, kGrad, kParam };
constexpr Kind kKinds[] = {kState, kGrad, kParam};

const NamedTensors& of(const Snapshot& s, Kind k) { return k == kState ? s.state : k == kGrad ? s.grads : s.params; }

// The worst W-rank vs 1-rank difference of one tensor over all steps.
struct Diff {
  double abs = 0, rel = 0;
  double scale = 0;            // largest |1-rank value|: how large the tensor is, next to atol
  int64_t differing = 0;       // elements not bitwise equal, summed over steps
  int64_t first_bad_step = 0;  // 0: never failed
};

double element(const Tensor& t, int64_t j) {
  return t.dtype() == DType::f32 ? double(t.data<float>()[j]) : double(t.data<int64_t>()[j]);
}

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

namespace {

// Where rank `rank`'s checkpoint tensors after `step` first differ from 1
// rank's, byte for byte ("" where none does): the tensor, how many elements
// and the first and largest difference.
std::string first_difference(const NamedTensors& got, const NamedTensors& want, int64_t step, int rank, int world) {
  for (size_t i = 0; i < want.size(); ++i) {
    const Tensor &a = got[i].second, &b = want[i].second;
    if (got[i].first != want[i].first || a.shape() != b.shape() || a.dtype() != b.dtype())
      return fmt::format("step {}: rank {} holds '{}' {} where 1 rank holds '{}' {}", step, rank, got[i].first,
                         a.desc(), want[i].first, b.desc());
    if (std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0) continue;
    int64_t differing = 0, first = -1;
    double worst = 0;
    const size_t w = dtype_size(a.dtype());
    for (int64_t j = 0; j < a.numel(); ++j) {
      if (std::memcmp(static_cast<const char*>(a.raw_data()) + j * w, static_cast<const char*>(b.raw_data()) + j * w,
                      w) == 0)
        continue;
      if (first < 0) first = j;
      ++differing;
      double d = std::abs(element(a, j) - element(b, j));
      if (!(d <= worst)) worst = d;  // a NaN sticks
    }
    return fmt::format("step {}: '{}' differs on rank {} of {} from 1 rank in {} of {} elements (first [{}]: {} vs "
                       "{}; largest difference {:.3g})", step, want[i].first, rank, world, differing, a.numel(), first,
                       element(a, first), element(b, first), worst);
  }
  return "";
}

// Whole-run mode: every checkpoint tensor after every step, 1 rank vs every
// one of W ranks, byte for byte.
CheckDdpResult check_whole_run(const Config& cfg, const Dataset& data, const CheckDdpOptions& o) {
  CheckDdpResult r;
  std::vector<NamedTensors> one(o.steps);
  {
    TrainOptions opt = quiet();
    opt.after_step = [&](const StepView& v) { one[v.step - 1] = host_copies(checkpoint_tensors(v.parts)); };
    train(thread_ranks(cfg, 1), data, opt);
  }
  r.tensors = static_cast<int64_t>(one[0].size());
  std::mutex mu;
  TrainOptions opt = quiet();
  opt.after_step = [&](const StepView& v) {
    const int64_t step = v.step;
    const int rank = v.rank;
    NamedTensors got = host_copies(checkpoint_tensors(v.parts));
    const NamedTensors& want = one[step - 1];
    const std::string failure = first_difference(got, want, step, rank, o.world);
    std::lock_guard lock(mu);
    // The earliest step wins (steps finish in order); within it, the first rank to report.
    if (!failure.empty() && r.first_failure.empty()) r.first_failure = failure;
  };
  const bool mpi = o.backend == "mpi";
  Config wide = thread_ranks(cfg, o.world);
  if (mpi) wide.distributed.backend = "mpi";
  try {
    train(wide, data, opt);
  } catch (const Error& e) {
    r.ranks_identical = false;
    r.first_failure = fmt::format("the {} ranks failed: {}", o.world, e.what());
  }
  int world = o.world;
  bool lead = true;
  if (mpi) {
    // Each process compared its own rank: one collective agrees on the
    // outcome, and a failing rank says why on its own stderr.
    bool any = false;
    int rank = 0;
    launch_ranks({.backend = "mpi"}, [&](Communicator& comm) {
      Tensor failed = full({1}, r.first_failure.empty() ? 0.0 : 1.0, DType::i64);
      comm.all_reduce(failed, ReduceOp::max);
      any = failed.data<int64_t>()[0] != 0;
      world = comm.world_size();
      rank = comm.rank();
    });
    lead = rank == 0;
    if (!r.first_failure.empty()) fmt::print(stderr, "check-ddp: mpi rank {}: {}\n", rank, r.first_failure);
    if (any && r.first_failure.empty()) r.first_failure = "another mpi rank differs from 1 rank (its stderr says how)";
  }
  r.passed = r.first_failure.empty();
  r.state_bitwise = r.passed;
  if (o.print && lead) {
    fmt::print("check-ddp: a whole run of {} step{} on 1 rank and on {} {} ranks: every one of the {} checkpoint "
               "tensors (parameters, optimizer state, codebooks, counters) bit for bit after every step\n",
               o.steps, o.steps == 1 ? "" : "s", world, mpi ? "mpi" : "thread", r.tensors);
    fmt::print("check-ddp: {}{}\n", r.passed ? "PASSED" : "FAILED", r.passed ? "" : " (" + r.first_failure + ")");
  }
  return r;
}

// The worst difference of every tensor over the steps compared, and the
// names per kind in the model's order (for the report).
struct Comparison {
  std::map<std::pair<Kind, std::string>, Diff> worst;
  std::vector<std::string> order[3];
};

// The W ranks' snapshots after `step` against the 1-rank one (`one`):
// ranks must be identical to each other, quantizer state bitwise equal to 1
// rank, gradients and parameters within the tolerances. Records the worst
// differences in `c`, the first failure in `r`.
void compare_step(int64_t step, const Snapshot& one, const std::vector<Snapshot>& ranks, const CheckDdpOptions& o,
                  Comparison& c, CheckDdpResult& r) {
  auto& worst = c.worst;
  auto& order = c.order;
  for (Kind kind : kKinds) {
    const NamedTensors& ref = of(one, kind);
    const char* what = kind == kGrad ? " gradient" : "";
    for (size_t i = 0; i < ref.size(); ++i) {
      const auto& [name, want] = ref[i];
      auto key = std::make_pair(kind, name);
      if (!worst.count(key)) order[kind].push_back(name);
      Diff& d = worst[key];
      // `why` formats the message; only the first failure of the run is
      // kept, so it is called only while none is recorded.
      auto fail = [&](auto why) {
        if (!d.first_bad_step) d.first_bad_step = step;
        if (r.first_failure.empty()) r.first_failure = fmt::format("step {}: {}", step, why());
      };
      const Tensor& got = of(ranks[0], kind)[i].second;
      for (int rank = 1; rank < o.world; ++rank) {
        const Tensor& other = of(ranks[rank], kind)[i].second;
        if (std::memcmp(other.raw_data(), got.raw_data(), other.nbytes())) {
          r.ranks_identical = false;
          fail([&] { return fmt::format("'{}'{} differs between rank 0 and rank {}", name, what, rank); });
        }
      }
      const size_t width = dtype_size(got.dtype());
      const auto* pg = static_cast<const unsigned char*>(got.raw_data());
      const auto* pw = static_cast<const unsigned char*>(want.raw_data());
      for (int64_t j = 0; j < want.numel(); ++j) {
        d.scale = std::max(d.scale, std::abs(element(want, j)));
        if (std::memcmp(pg + j * width, pw + j * width, width) == 0) continue;  // bitwise equal
        ++d.differing;
        double a = element(got, j), b = element(want, j), diff = std::abs(a - b);
        if (!std::isnan(d.abs) && !(diff <= d.abs)) d.abs = diff;  // a NaN sticks
        if (diff > 0) d.rel = std::max(d.rel, diff / std::max(std::abs(b), 1e-30));
        if (kind == kState) {
          r.state_bitwise = false;
          fail([&] {
            return fmt::format("'{}'[{}] is {} on {} ranks, {} on 1 rank: quantizer state must be bitwise equal", name,
                               j, a, o.world, b);
          });
        } else if (!(diff <= o.atol + o.rtol * std::abs(b))) {
          fail([&] { return fmt::format("'{}'{}[{}] is {} on {} ranks, {} on 1 rank", name, what, j, a, o.world, b); });
        }
      }
      if (kind == kParam) r.worst_abs = std::max(r.worst_abs, d.abs);
      if (kind == kGrad) r.worst_grad_abs = std::max(r.worst_grad_abs, d.abs);
    }
  }
}

// The per-tensor table of a per-step check, and the verdict.
void print_step_report(const Comparison& c, const CheckDdpOptions& o, const CheckDdpResult& r) {
  const auto& worst = c.worst;
  const auto& order = c.order;
  fmt::print("check-ddp: {} step{}, each from the same state and batch: 1 rank vs {} thread ranks\n", o.steps,
             o.steps == 1 ? "" : "s", o.world);
  fmt::print("{:<44} {:>10} {:>10} {:>10}\n", "tensor", "max |x|", "max abs", "max rel");
  const std::string tolerance = fmt::format("|a - b| <= {} + {} |b|", o.atol, o.rtol);
  const std::string heading[3] = {
      "quantizer state (buffers): bit for bit",
      "gradients, all-reduced, before the optimizer step: " + tolerance,
      "parameters after the optimizer step: " + tolerance,
  };
  for (Kind kind : kKinds) {
    if (order[kind].empty()) continue;
    fmt::print("-- {}\n", heading[kind]);
    for (const std::string& name : order[kind]) {
      const Diff& d = worst.at({kind, name});
      std::string result = d.first_bad_step ? fmt::format("FAIL (step {})", d.first_bad_step) : "ok";
      if (d.differing == 0)
        fmt::print("{:<44} {:>10.3e} {:>21}  {}\n", name, d.scale, "bitwise", result);
      else
        fmt::print("{:<44} {:>10.3e} {:>10.3e} {:>10.3e}  {}\n", name, d.scale, d.abs, d.rel, result);
    }
  }
  fmt::print("ranks bitwise identical after every step: {}\n", r.ranks_identical ? "yes" : "NO");
  fmt::print("check-ddp: {}{}\n", r.passed ? "PASSED" : "FAILED", r.passed ? "" : " (" + r.first_failure + ")");
}

}  // namespace

CheckDdpResult check_ddp(Config cfg, const Dataset& data, const CheckDdpOptions& o) {
  // Zero steps would compare nothing and pass: a check that proves nothing.
  VQDDP_CHECK(limits::check_steps.contains(o.steps), "check-ddp: steps {}",
              limits::check_steps.violation(std::to_string(o.steps)));
  VQDDP_CHECK(limits::world.contains(o.world), "check-ddp: world {}", limits::world.violation(std::to_string(o.world)));
  cfg.schedule.steps = o.steps;
  if (o.mode == CheckDdpOptions::Mode::whole_run) return check_whole_run(cfg, data, o);
  CheckDdpResult r;
  std::filesystem::path tmp =
      std::filesystem::temp_directory_path() / fmt::format("vqddp-check-ddp-{}-{}", ::getpid(), o.world);
  std::filesystem::create_directories(tmp);
  auto state_file = [&](int64_t step) { return (tmp / fmt::format("state-{}.safetensors", step)).string(); };

  // 1 rank, whole batches: its state after every step, saved to disk so the
  // W-rank steps can start from it.
  std::vector<Snapshot> one(o.steps);
  {
    Config c = thread_ranks(cfg, 1);
    TrainOptions opt = quiet();
    opt.after_gradients = [&](int64_t step, int, const CodecModel& model) { one[step - 1].grads = host_gradients(model); };
    opt.after_step = [&](const StepView& v) {
      one[v.step - 1].state = host_copies(v.codec.named_buffers());
      one[v.step - 1].params = all_parameters(v.parts);
      save_checkpoint(state_file(v.step), v.parts, v.step, o.steps, cfg.source);
    };
    train(c, data, opt);
  }

  Comparison comparison;
  for (int64_t step = 1; step <= o.steps; ++step) {
    Config c = thread_ranks(cfg, o.world);
    TrainOptions opt = quiet();
    opt.resume = step == 1 ? "" : state_file(step - 1);
    opt.stop_at_step = step;
    std::vector<Snapshot> ranks(o.world);
    opt.after_gradients = [&](int64_t, int rank, const CodecModel& model) { ranks[rank].grads = host_gradients(model); };
    opt.after_step = [&](const StepView& v) {
      ranks[v.rank].state = host_copies(v.codec.named_buffers());
      ranks[v.rank].params = all_parameters(v.parts);
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
    compare_step(step, one[step - 1], ranks, o, comparison, r);
  }
  std::filesystem::remove_all(tmp);

  r.passed = r.first_failure.empty();
  if (o.print) print_step_report(comparison, o, r);
  return r;
}

}  // namespace vqddp
