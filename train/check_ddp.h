// `vqddp check-ddp`: proves a config's data-parallel semantics before GPU
// hours are spent on it.
//
// The run goes once on 1 rank over whole global batches, saving its full
// state (parameters, buffers, optimizer) before every step. Then, for every
// step, W thread ranks start from that same state and take the same step on
// shards of the same batch. After each step, every parameter and buffer is
// compared: the W ranks must agree with each other bit for bit, and with
// the 1-rank step within |a - b| <= atol + rtol * |b|.
//
// Why from a common state, step by step: the only legitimate difference
// between 1 and W ranks is float rounding (gradients summed per rank, then
// across ranks). Run freely, k-means and nearest-code assignment amplify
// such 1e-7 differences into different but equally valid codebooks after a
// few steps (a near-tie row picks the other code), which would hide real
// bugs in noise or fail correct configs. Restarting each step from the same
// state keeps the comparison at rounding level, while every real DDP bug
// (unreduced codebook statistics, missing gradient reduction, ranks taking
// different dropout or schedule decisions) shows up in the step it breaks.
#pragma once

#include <string>

#include "train/config.h"
#include "train/dataset.h"

namespace vqddp {

struct CheckDdpOptions {
  int world = 4;
  int64_t steps = 5;
  double rtol = 1e-4;
  double atol = 1e-6;
  bool print = true;
};

struct CheckDdpResult {
  bool passed = false;
  bool ranks_identical = true;
  double worst_abs = 0;       // largest |W-rank - 1-rank| over every tensor and step
  std::string first_failure;  // "step 3: 'quantizer.layer0.embed'[12] ..." when failed
};

CheckDdpResult check_ddp(Config config, const Dataset& data, const CheckDdpOptions& options);

}  // namespace vqddp
