// Data parallelism for a module: the same parameters on every rank, and
// gradients that are the gradient of the GLOBAL batch.
//
// At construction every parameter and buffer is broadcast from rank 0, so
// ranks start identical even if they were initialised differently.
//
// Gradients, the exact way (what the trainer does): open an ExactBatchScope
// per step (engine/exact_batch.h, comm/batch_reduce.h exact_batch_for); the
// losses are then global-batch means and backward() itself reduces the
// gradients over the ranks, bit for bit what one rank computes on the whole
// batch. all_reduce_gradients() is not called then.
//
// Gradients, the classic way (a loop without exact steps): each rank
// backpropagates its share of the global loss, its local mean loss times
// N_r / N (loss_scale()), and all_reduce_gradients() then SUMS the gradients
// over ranks, in buckets of about bucket_bytes. With uneven shards this is
// the gradient of the global batch mean up to float rounding, whose bits
// depend on the split. Every parameter takes part in every reduction: one
// without a gradient on this rank contributes zeros, so the bucket layout
// and the number of collectives never differ between ranks.
#pragma once

#include <vector>

#include "comm/communicator.h"
#include "engine/nn.h"

namespace vqddp {

// Every parameter and buffer of `module` set to rank 0's, so ranks start
// identical however they were initialised. A collective: every rank calls
// it. What the trainer (exact steps) needs of data parallelism at the start.
void broadcast_parameters(Module& module, Communicator& comm);

// The classic loop's data parallelism (above). It stays beside the exact
// steps for programs that embed vqddp without them; the trainer does not
// use it. Its buckets are laid out at the first all_reduce_gradients().
class DistributedDataParallel {
 public:
  // Every rank must construct it (broadcast_parameters).
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
  size_t bucket_bytes_;
  bool sync_ = true;

  void lay_out_buckets();
};

}  // namespace vqddp
