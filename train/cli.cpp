// The `vqddp` executable: one program, one subcommand per job.
#include <fmt/format.h>

#include <cstring>
#include <exception>
#include <string>

#include "engine/blas.h"
#include "engine/error.h"
#include "train/cli_args.h"
#include "train/demo_mlp.h"
#include "train/replay.h"

namespace {

void usage() {
  fmt::print(
      "usage: vqddp <command> [options]\n"
      "commands:\n"
      "  demo [--steps N] [--seed S]   fit a small MLP with the engine, printing progress\n"
      "  replay IN OUT [--world W] [--shards LIST]\n"
      "                                run recorded batches through one EMA codebook on W thread ranks\n"
      "                                and write the final state (format: README.md, 'replay')\n");
}

int run_demo(int argc, char** argv) {
  vqddp::CliArgs args("demo", argc, argv, 2, {"steps", "seed"});
  args.expect_positional(0, "no positional arguments");
  vqddp::DemoOptions opt;
  opt.steps = static_cast<int>(args.get_int("steps", opt.steps));
  opt.seed = static_cast<unsigned long long>(args.get_int("seed", 0));
  double val = vqddp::run_mlp_demo(opt);
  fmt::print("demo: final validation mse {:.5f}\n", val);
  return 0;
}

int run_replay(int argc, char** argv) {
  vqddp::CliArgs args("replay", argc, argv, 2, {"world", "shards"});
  args.expect_positional(2, "an input and an output file");
  vqddp::ReplayOptions opt{args.positional()[0], args.positional()[1], static_cast<int>(args.get_int("world", 1)),
                           args.get("shards", "")};
  int steps = vqddp::run_replay(opt);
  fmt::print("replay: {} batches on {} rank{} -> {}\n", steps, opt.world, opt.world == 1 ? "" : "s", opt.output);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  vqddp::blas_prefer_fast_core(argv);
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  try {
    std::string cmd = argv[1];
    if (cmd == "demo") return run_demo(argc, argv);
    if (cmd == "replay") return run_replay(argc, argv);
    fmt::print(stderr, "vqddp: unknown command '{}'\n", cmd);
    usage();
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "vqddp: error: {}\n", e.what());
    return 1;
  }
}
