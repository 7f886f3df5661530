#include "train/ddp.h"

#include <cstring>

namespace vqddp {

DistributedDataParallel::DistributedDataParallel(Module& module, Communicator& comm, size_t bucket_bytes)
    : params_(module.parameters()), comm_(comm), bucket_bytes_(bucket_bytes) {
  for (auto& [name, t] : module.named_parameters()) comm.broadcast(t, 0);
  for (auto& [name, t] : module.named_buffers()) comm.broadcast(t, 0);
}

float DistributedDataParallel::loss_scale(int64_t local, int64_t global) {
  return global == 0 ? 0.f : static_cast<float>(static_cast<double>(local) / static_cast<double>(global));
}

void DistributedDataParallel::all_reduce_gradients() {
  if (!sync_) return;
  std::vector<Tensor>& params = params_;
  size_t i = 0;
  while (i < params.size()) {
    // Pack parameters in registration order until the bucket is full.
    size_t j = i;
    int64_t elems = 0;
    do {
      elems += params[j].numel();
      ++j;
    } while (j < params.size() && static_cast<size_t>(elems + params[j].numel()) * 4 <= bucket_bytes_);
    Tensor bucket = empty({elems});  // (elems)
    float* p = bucket.data<float>();
    for (size_t k = i; k < j; ++k) {
      Tensor g = params[k].grad();
      if (g.defined())
        std::memcpy(p, g.data<float>(), g.numel() * sizeof(float));
      else
        std::memset(p, 0, params[k].numel() * sizeof(float));
      p += params[k].numel();
    }
    comm_.all_reduce(bucket, ReduceOp::sum);
    p = bucket.data<float>();
    for (size_t k = i; k < j; ++k) {
      Tensor g = params[k].grad();
      if (!g.defined()) {
        g = empty(params[k].shape());
        params[k].set_grad(g);
      }
      std::memcpy(g.data<float>(), p, g.numel() * sizeof(float));
      g.bump_version();
      p += params[k].numel();
    }
    i = j;
  }
}

}  // namespace vqddp
