#include "train/run_stop.h"

#include <fmt/format.h>

#include "comm/agree.h"

namespace vqddp {

void RunStop::agree_on_signal(int64_t done, int64_t last) {
  if (!opt_.stop_requested || done >= last) return;
  flag_.data<int64_t>()[0] = opt_.stop_requested();
  comm_.all_reduce(flag_, ReduceOp::max);
  stopped_by_ = static_cast<int>(flag_.data<int64_t>()[0]);
}

bool RunStop::agree_disk_low(const RunDir* run_dir, int64_t done) {
  const bool low = comm_.rank() == 0 && run_dir && run_dir->disk_low();
  Tensor seen = from_vector(std::vector<int64_t>{low ? 1 : 0, low ? run_dir->free_bytes() : -1}, {2});
  comm_.all_reduce(seen, ReduceOp::max);
  disk_free_ = seen.data<int64_t>()[1];
  if (seen.data<int64_t>()[0] == 0) return false;
  disk_low_at_ = done;
  return true;
}

void RunStop::stop_for_disk(const std::filesystem::path& dir) const {
  const std::string checkpoint = (dir / "checkpoint.safetensors").string();
  throw AgreedError(fmt::format("run directory {}: its disk is nearly full{} at step {}: stopped early, the "
                                "checkpoint of step {} is saved ({}); make room, then continue with: {}",
                                dir.string(), disk_free_ >= 0 ? fmt::format(" ({} free)", mib(disk_free_)) : "",
                                disk_low_at_, disk_low_at_, checkpoint,
                                opt_.resume_hint.empty() ? "--resume " + checkpoint : opt_.resume_hint),
                    source_position(__FILE__, __LINE__));
}

}  // namespace vqddp
