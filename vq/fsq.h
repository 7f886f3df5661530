// FSQ: finite scalar quantization (Mentzer et al. 2023). No codebook state:
// every rank quantizes on its own. quantize()'s one collective is its
// refusal of non-finite input on every rank alike, one all-reduce of W
// flags when the input is on the host, in a training step (training mode,
// grad on); inference issues none (vq/finite_rows.h).
//
// Per dimension j with L_j levels: half_l = (L_j - 1)(1 + 1e-3) / 2,
// offset = 0.5 for even L_j else 0, shift = atanh(offset / half_l);
//   bound(z) = tanh(z + shift) * half_l - offset
//   z_hat    = round(bound(z)) / (L_j // 2)       (round is straight-through)
// Index = sum_j (z_hat_j * (L_j // 2) + L_j // 2) * b_j with
// b = cumprod([1] + L[:-1]); the inverse is (i // b_j) mod L_j.
// bound_hard_clamp: clamp(., -1, 1) in place of tanh (and no shift).
// preserve_symmetry (Zhao et al. 2024, section 3.2; what ResidualFSQ's
// layers use): L_j codes spread evenly over [-1, 1], ends included,
//   t = tanh(z) (clamp(z, -1, 1) with bound_hard_clamp)
//   z_hat = 2/(L_j - 1) * floor((L_j - 1)(t + 1)/2 + 0.5) - 1   (floor straight-through)
// with digit (z_hat + 1)(L_j - 1)/2 in the index.
// Everything is float32, whatever the caller's precision would be.
#pragma once

#include <memory>
#include <vector>

#include "engine/nn.h"
#include "vq/quantizer.h"
#include "vq/device_constants.h"

namespace vqddp {

struct FSQOptions {
  std::vector<int> levels;  // L_j, each >= 2
  int64_t dim = 0;          // 0: levels.size() * num_codebooks (no projection)
  int num_codebooks = 1;
  bool preserve_symmetry = false;
  bool bound_hard_clamp = false;
  bool operator==(const FSQOptions&) const = default;
};

class FSQ : public Quantizer {
 public:
  FSQ(const FSQOptions& options, Generator& init_gen);

  // z (M, D) with D = levels.size() -> z_hat (M, D): bound, round (straight-
  // through), normalise to [-1, 1].
  Tensor round_codes(const Tensor& z) const;
  Tensor codes_to_indices(const Tensor& codes) const;    // (M, D) -> (M) int64
  Tensor indices_to_codes(const Tensor& indices) const;  // (M) int64 -> (M, D)
  // The forward output for indices (N) or (N, num_codebooks).
  Tensor decode(const Tensor& indices) const override;
  // The contract (vq/quantizer.h): indices (N, num_codebooks), a zero loss,
  // no metrics; takes no mask. Every rank must call: for host input it
  // all-reduces the ranks' non-finite flags (vq/finite_rows.h).
  QuantizerOutput quantize(const Tensor& x, Communicator& comm, const Tensor& mask = Tensor()) override;
  std::vector<int64_t> layer_sizes() const override {
    return std::vector<int64_t>(opt_.num_codebooks, codebook_size_);
  }
  int64_t dim() const override { return opt_.dim; }

  int64_t codebook_size() const { return codebook_size_; }
  int64_t code_dim() const { return static_cast<int64_t>(opt_.levels.size()); }
  const FSQOptions& options() const { return opt_; }

 private:
  FSQOptions opt_;
  int64_t codebook_size_ = 1;
  const Tensor& constant(size_t i, Device device) const { return constants_.on(i, device); }
  // (D) per-dimension constants, uploaded once per device: float32 half_l,
  // offset, shift, half_width (the digit's: L // 2, or (L - 1) / 2 with
  // preserve_symmetry), L - 1 and 2 / (L - 1); int64 levels, basis (the
  // place value of each digit of an index).
  DeviceConstants constants_;
  size_t half_l_ = 0, offset_ = 0, shift_ = 0, half_width_ = 0, levels_minus_1_ = 0, step_ = 0, levels_ = 0, basis_ = 0;
  Projection projection_;
};

// The codebook size of a level list: the product of the levels.
int64_t fsq_codebook_size(const std::vector<int>& levels);

}  // namespace vqddp
