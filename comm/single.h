// The world of one: every collective is a local no-op or copy. This is what
// plain single-process use passes to the modules, so they never need a
// "distributed or not" flag (docs/design.md invariant 8).
#pragma once

#include "comm/communicator.h"

namespace vqddp {

class SingleCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend() const override { return "single"; }

 protected:
  // No other rank to disagree with: the fingerprints go unused.
  void do_all_reduce(Tensor& t, ReduceOp op, const Fingerprint& fp) override;
  void do_broadcast(Tensor& t, int root, const Fingerprint& fp) override;
  void do_all_gather(const Tensor& in, Tensor& out, const Fingerprint& fp) override;
  void do_all_gather_rows(const Tensor& in, const std::vector<int64_t>& counts, Tensor& out,
                          const Fingerprint& fp) override;
  void do_barrier(const Fingerprint& fp) override;
};

}  // namespace vqddp
