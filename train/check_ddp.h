// `vqddp check-ddp`: proves a config's data-parallel semantics before GPU
// hours are spent on it. The same run (same global batches) goes once on 1
// rank and once on W thread ranks; after every step every parameter and
// buffer is compared: W ranks must agree with each other bit for bit, and
// with the 1-rank run within |a - b| <= atol + rtol * |b|.
#pragma once

#include "train/config.h"
#include "train/dataset.h"

namespace vqddp {

struct CheckDdpOptions {
  int world = 4;
  int64_t steps = 5;
  double rtol = 1e-3;
  double atol = 1e-4;
  bool print = true;
};

struct CheckDdpResult {
  bool passed = false;
  bool ranks_identical = true;
  double worst_abs = 0;  // largest |W-rank - 1-rank| over every tensor and step
  std::string first_failure;  // "step 3: quantizer.layer0.embed ..." when failed
};

CheckDdpResult check_ddp(Config config, const Dataset& data, const CheckDdpOptions& options);

}  // namespace vqddp
