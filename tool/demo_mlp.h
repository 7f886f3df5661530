// `vqddp demo`: fits a small MLP with the engine alone, printing progress.
//
// The smallest end-to-end use of engine/ alone (no quantizer, no
// communicator): a 2-hidden-layer MLP fits sin(pi x) cos(pi y) with modules,
// autograd, AdamW, gradient clipping and the counter-based generator, and
// prints the BLAS core in use. A smoke test of a fresh build that needs no
// data files; `vqddp train` is where quantizers are trained.
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
