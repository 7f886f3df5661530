// `vqddp demo`: fits a small MLP with the engine alone, printing progress.
//
// The smallest end-to-end use of engine/: modules, autograd, AdamW,
// gradient clipping and the counter-based generator. It stays useful once
// training lands as a smoke test of a fresh build.
#pragma once

namespace vqddp {

struct DemoOptions {
  int steps = 2000;
  int batch = 256;
  int hidden = 64;
  int log_every = 200;
  unsigned long long seed = 0;
};

// Returns the final validation loss.
double run_mlp_demo(const DemoOptions& opt);

}  // namespace vqddp
