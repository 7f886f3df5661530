// Data parallelism for a module: the same parameters on every rank, and
// gradients that are the gradient of the GLOBAL batch.
//
// At construction every parameter and buffer is broadcast from rank 0, so
// ranks start identical even if they were initialised differently.
// Gradients: each rank backpropagates its share of the global loss, i.e.
// its local mean loss times N_r / N (loss_scale()), and all_reduce_gradients()
// then SUMS the gradients over ranks, in buckets of about bucket_bytes.
// With uneven shards this is exactly the gradient of the global batch mean
// (a plain average of per-rank means would weight a rank with 3 rows like
// one with 300), and terms over global statistics that all-reduce inside
// autograd (LFQ's codebook entropy) come out exact too.
//
// Every parameter takes part in every reduction: one without a gradient on
// this rank (unused this step) contributes zeros, so the bucket layout and
// the number of collectives never differ between ranks.
#pragma once

#include <vector>

#include "comm/communicator.h"
#include "engine/nn.h"

namespace vqddp {

class DistributedDataParallel {
 public:
  // Every rank must construct it (broadcasts).
  DistributedDataParallel(Module& module, Communicator& comm, size_t bucket_bytes = 4 << 20);

  // N_r / N for this rank's rows in a global batch of `global_rows`.
  static float loss_scale(int64_t local_rows, int64_t global_rows);

  // Every rank must call after backward (unless inside a NoSync scope).
  void all_reduce_gradients();

  // Gradient accumulation: while a NoSync lives, all_reduce_gradients() is a
  // no-op; gradients keep accumulating locally and are reduced by the first
  // call after it ends. Every rank must use the same NoSync scopes.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp) : ddp_(ddp), previous_(ddp.sync_) { ddp.sync_ = false; }
    ~NoSync() { ddp_.sync_ = previous_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };


 private:
  std::vector<Tensor> params_;  // the module's parameters, listed once (the names are built per call)
  // Buckets and each parameter's slot in its bucket (a view), laid out once:
  // a step only copies gradients in and out.
  std::vector<Tensor> buckets_;
  std::vector<size_t> bucket_of_;  // per parameter
  std::vector<Tensor> slots_;      // per parameter: (numel) view into its bucket
  Communicator& comm_;
  bool sync_ = true;
};

}  // namespace vqddp
