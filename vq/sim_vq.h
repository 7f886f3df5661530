// SimVQ (Zhu et al. 2024, arXiv 2411.02038; vector-quantize-pytorch's
// SimVQ): the codebook is implicit, a frozen random matrix C (K, F) times a
// learned linear map W (dim, F): codes = C W^T. Every code moves whenever W
// does, so no code is left behind to die, and there is no EMA, no k-means,
// no revival: the only state a step changes is W, through its gradient.
//
//   C = randn(K, F) * F^-1/2        (buffer "frozen_codebook", F =
//                                     frozen_codebook_dim, default dim)
//   W: Linear(F, dim), no bias      ("code_transform.weight", torch's
//                                     Linear init U(+-1/sqrt(F)))
//   index_n = argmin_k |x_n - codes_k|   (vq/assign.h: batch-invariant,
//                                          ties to the lowest k)
//   q_n = codes[index_n]            (gradient to W)
//   loss = commitment_weight * (mse(x.detach(), q)
//          + input_to_quantize_commit_loss_weight * mse(x, q.detach()))
//   output: rotate_to(x, q) with rotation_trick (the default), else
//           straight-through (vq/rotation_trick.h)
//
// DDP: no batch statistic but the loss means, which are global in an exact
// step (vq/losses.h); W's gradient is reduced with every parameter's. Every
// rank computes the same codes from the same W, so a row's index never
// depends on the split. Takes no mask.
#pragma once

#include <memory>

#include "engine/core/config_reader.h"
#include "engine/nn.h"
#include "vq/quantizer.h"

namespace vqddp {

struct SimVQOptions {
  int64_t dim = 0;
  int64_t codebook_size = 1024;
  int64_t frozen_codebook_dim = 0;  // 0: dim
  bool rotation_trick = true;
  float input_to_quantize_commit_loss_weight = 0.25f;
  float commitment_weight = 1.f;
  bool operator==(const SimVQOptions&) const = default;
};

class SimVQ : public Quantizer {
 public:
  SimVQ(const SimVQOptions& options, Generator& init_gen);

  // The contract (vq/quantizer.h): indices (N, 1), the loss above as its
  // one layer loss, no metrics, no mask. No collective but the loss means
  // of an exact step.
  QuantizerOutput quantize(const Tensor& x, Communicator& comm, const Tensor& mask = Tensor()) override;
  Tensor decode(const Tensor& indices) const override;  // (N) or (N, 1) -> (N, dim)
  std::vector<int64_t> layer_sizes() const override { return {opt_.codebook_size}; }
  int64_t dim() const override { return opt_.dim; }

  // The implicit codebook C W^T (K, dim), with W's gradient.
  Tensor codes() const;
  const SimVQOptions& options() const { return opt_; }

 private:
  SimVQOptions opt_;
  Tensor frozen_;  // (K, F)
  std::shared_ptr<Linear> transform_;
};

// SimVQ's keys (codebook_size, frozen_codebook_dim, rotation_trick,
// commitment_weight, input_to_quantize_commit_loss_weight), which
// residual_sim_vq's layers share; with the input width `dim` (0: unknown)
// the `layers` frozen codebooks' size is refused by key when too large.
void read_sim_vq_keys(ConfigSection& s, SimVQOptions& o, int64_t dim, int64_t layers);

}  // namespace vqddp
