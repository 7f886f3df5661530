#include "train/ddp.h"

namespace vqddp {

void broadcast_parameters(Module& module, Communicator& comm) {
  for (auto& [name, t] : module.named_parameters()) comm.broadcast(t, 0);
  for (auto& [name, t] : module.named_buffers()) comm.broadcast(t, 0);
}

DistributedDataParallel::DistributedDataParallel(Module& module, Communicator& comm, size_t bucket_bytes)
    : params_(module.parameters()), comm_(comm), bucket_bytes_(bucket_bytes) {
  broadcast_parameters(module, comm);
}

void DistributedDataParallel::lay_out_buckets() {
  // Pack parameters in registration order until a bucket is full (a
  // parameter larger than a bucket gets one of its own).
  size_t i = 0;
  while (i < params_.size()) {
    size_t j = i;
    int64_t elems = 0;
    do {
      elems += params_[j].numel();
      ++j;
    } while (j < params_.size() && static_cast<size_t>(elems + params_[j].numel()) * sizeof(float) <= bucket_bytes_);
    Tensor bucket = empty({elems}, DType::f32, params_[i].device());
    for (int64_t at = 0; i < j; at += params_[i].numel(), ++i) {
      bucket_of_.push_back(buckets_.size());
      slots_.push_back(bucket.slice_rows(at, at + params_[i].numel()));
    }
    buckets_.push_back(bucket);
  }
}

float DistributedDataParallel::loss_scale(int64_t local, int64_t global) {
  return global == 0 ? 0.f : static_cast<float>(static_cast<double>(local) / static_cast<double>(global));
}

void DistributedDataParallel::all_reduce_gradients() {
  if (!sync_) return;
  if (buckets_.empty()) lay_out_buckets();
  size_t k = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    size_t first = k;
    for (; k < params_.size() && bucket_of_[k] == b; ++k) {
      Tensor g = params_[k].grad();
      if (g.defined())
        slots_[k].copy_(g.reshape({-1}));
      else
        slots_[k].fill_(0);
    }
    comm_.all_reduce(buckets_[b], ReduceOp::sum);
    for (size_t p = first; p < k; ++p) {
      Tensor g = params_[p].grad();
      if (!g.defined()) {
        g = empty(params_[p].shape(), DType::f32, params_[p].device());
        params_[p].set_grad(g);
      }
      g.reshape({-1}).copy_(slots_[p]);  // a view: writes g's storage and bumps its version
    }
  }
}

}  // namespace vqddp
