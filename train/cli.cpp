// The `vqddp` executable: one program, one subcommand per job.
#include <fmt/format.h>

#include <cstring>
#include <exception>
#include <string>

#include "engine/blas.h"
#include "engine/error.h"
#include "train/demo_mlp.h"

namespace {

void usage() {
  fmt::print(
      "usage: vqddp <command> [options]\n"
      "commands:\n"
      "  demo [--steps N] [--seed S]   fit a small MLP with the engine, printing progress\n");
}

int run_demo(int argc, char** argv) {
  vqddp::DemoOptions opt;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    bool has_value = i + 1 < argc;
    if (a == "--steps" && has_value)
      opt.steps = std::stoi(argv[++i]);
    else if (a == "--seed" && has_value)
      opt.seed = std::stoull(argv[++i]);
    else
      throw vqddp::Error(fmt::format("demo: unknown or incomplete option '{}'", a));
  }
  double val = vqddp::run_mlp_demo(opt);
  fmt::print("demo: final validation mse {:.5f}\n", val);
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
    fmt::print(stderr, "vqddp: unknown command '{}'\n", cmd);
    usage();
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "vqddp: error: {}\n", e.what());
    return 1;
  }
}
