// LatentQuantize: vector-quantize-pytorch's LatentQuantize (latent
// quantization, arXiv 2305.18842). z = project_in(x) (M, C * codebooks) is
// split into codebooks of C latents; latent j of each is snapped to the
// nearest of its L_j values (|z - v| argmin, ties to the lowest), straight
// through. The values start as the reference's grid: linspace(-0.5, 0.5, L)
// for odd L, arange(L) / L - 0.5 for even L.
//
//   loss = commitment_loss_weight * mse(x.detach(), out)
//        + quantization_loss_weight * mse(out.detach(), x)      (training)
// with out the quantizer's output (after project_out) and x its input, as
// the reference (both means over the GLOBAL batch in an exact step; 0 in
// inference). Index = sum_j digit_j b_j, b as FSQ's; decode maps a digit d
// to (d - L//2) / (2 (L//2)) as the reference's indices_to_codes.
//
// Where vqddp differs: the values are buffers `values_per_latent.<j>` (the
// reference's names); there they are parameters, but its own straight-
// through estimator cuts their gradient, so they never train. The index is
// the argmin's digit; the reference derives it from the values, which is
// the same while they hold the grid. No collective beyond the losses' means.
#pragma once

#include <vector>

#include "engine/nn.h"
#include "vq/device_constants.h"
#include "vq/quantizer.h"

namespace vqddp {

struct LatentQuantizeOptions {
  std::vector<int> levels;  // L_j per latent, each >= 2
  int64_t dim = 0;          // 0: levels.size() * num_codebooks (no projection)
  int num_codebooks = 1;
  float commitment_loss_weight = 0.1f;
  float quantization_loss_weight = 0.1f;
  bool operator==(const LatentQuantizeOptions&) const = default;
};

class LatentQuantize : public Quantizer {
 public:
  LatentQuantize(const LatentQuantizeOptions& options, Generator& init_gen);

  // indices (N, num_codebooks); takes no mask.
  QuantizerOutput quantize(const Tensor& x, Communicator& comm, const Tensor& mask = Tensor()) override;
  Tensor decode(const Tensor& indices) const override;
  std::vector<int64_t> layer_sizes() const override {
    return std::vector<int64_t>(opt_.num_codebooks, codebook_size_);
  }
  int64_t dim() const override { return opt_.dim; }

 private:
  LatentQuantizeOptions opt_;
  int64_t codebook_size_ = 1;
  std::vector<Tensor> values_;  // (L_j) per latent: buffers
  DeviceConstants constants_;
  std::vector<size_t> digits_;  // (L_j, 1) float 0 .. L_j - 1, per latent
  size_t ones_ = 0, levels_ = 0, basis_ = 0, half_width_ = 0;
  Projection projection_;
};

}  // namespace vqddp
