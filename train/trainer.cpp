// train(): one RankRun per rank (train/rank_run.h), launched on the
// config's backend.
#include "train/trainer.h"

#include <chrono>
#include <mutex>

#include "comm/backends.h"
#include "engine/gemm_floor.h"
#include "engine/precision.h"
#include "train/rank_run.h"

namespace vqddp {

TrainResult train(const Config& cfg, const Dataset& data, const TrainOptions& opt) {
  TrainResult result;
  std::mutex result_mu;
  const auto start = std::chrono::steady_clock::now();
  if (cfg.run.device == "cuda") check_device(Device::cuda(0));
  std::vector<int64_t> sizes;
  for (const DataRows& s : data.sources) sizes.push_back(s.rows());
  const uint32_t fingerprint = data_fingerprint(data);  // once, shared by the rank threads
  LaunchOptions launch{cfg.distributed.backend, cfg.distributed.world_size,
                       std::chrono::milliseconds(static_cast<int64_t>(cfg.distributed.timeout_s * 1000)),
                       cfg.distributed.check_collectives};
  // The floor before the ranks share the cores out (engine/gemm_floor.h).
  TrainOptions o = opt;
  if (o.profile && !(o.gemm_floor > 0)) o.gemm_floor = measure_gemm_floor(parse_device(cfg.run.device, "run.device"));
  const Precision precision = parse_precision(cfg.run.precision, "run.precision");
  launch_ranks(launch, [&](Communicator& comm) {
    PrecisionScope products(precision);  // the rank's thread, for its whole run
    RankRun(cfg, data, o, comm, sizes, fingerprint).run(result, result_mu);
  });
  result.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace vqddp
