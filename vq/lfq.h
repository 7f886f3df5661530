// LFQ: lookup-free quantization (Yu et al. 2023, MAGVIT-v2). Each of B
// dimensions is quantized to its sign (times codebook_scale); the index
// reads the signs as bits, the FIRST dimension as the MOST significant bit.
//
// Training loss (training mode with grad on):
//   entropy_loss = mean_n H(p_n) - diversity_gamma * H(mean_n p_n)
//   p_n = softmax(2 * inv_temperature * z_n . c_k) over all 2^B codes c_k
//   loss = entropy_loss_weight * entropy_loss
//        + commitment_weight * mse(z, q.detach())
// The codebook term needs the average code probability of the GLOBAL batch:
// the sums of p over every rank's rows come from one differentiable
// collective (comm/batch_reduce.h), so the gradient is the global one.
// Inference issues no collective and returns a zero loss.
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "engine/core/config_reader.h"
#include "engine/nn.h"
#include "vq/device_constants.h"
#include "vq/quantizer.h"

namespace vqddp {

// Whether LFQ takes `codebook_size`: a power of two in [2, 65536] (every
// code is a column of the entropy's (N, 2^B) matrix). The one check, for
// the constructor and the config reader.
constexpr bool lfq_codebook_size_ok(int64_t k) { return k >= 2 && (k & (k - 1)) == 0 && k <= (int64_t{1} << 16); }

struct LFQOptions {
  int64_t dim = 0;  // 0: codebook_dim (no projection)
  int64_t codebook_size = 1024;  // a power of two, at most 2^16 (the entropy uses all codes)
  float entropy_loss_weight = 0.1f;
  float commitment_weight = 0.25f;
  float diversity_gamma = 1.f;
  float inv_temperature = 100.f;
  float codebook_scale = 1.f;
  bool operator==(const LFQOptions&) const = default;
};

class LFQ : public Quantizer {
 public:
  LFQ(const LFQOptions& options, Generator& init_gen);

  Tensor decode(const Tensor& indices) const override;  // (N) or (N, 1) -> (N, dim)
  // The contract (vq/quantizer.h): indices (N, 1), loss and its one layer
  // loss, no metrics; takes no mask. extras: "entropy_loss" and
  // "commitment_loss" (scalars, 0 in inference); in a training step also
  // "per_sample_entropy" and "codebook_entropy" (detached scalars on the
  // input's device: read them only when they are logged, a read waits for
  // the device). In training every rank must call and run backward (the
  // entropy term's all-reduce has a collective in its backward too).
  QuantizerOutput quantize(const Tensor& x, Communicator& comm, const Tensor& mask = Tensor()) override;
  std::vector<int64_t> layer_sizes() const override { return {opt_.codebook_size}; }
  int64_t dim() const override { return opt_.dim; }

  // Bits per code (log2 of the codebook size): the width of each code vector.
  int64_t code_bits() const { return bits_; }

 private:
  Tensor codes_of(const Tensor& indices) const;  // (N) -> (N, B) of +-scale

  LFQOptions opt_;
  int64_t bits_;
  // (2^B, B) every code, for the entropy; uploaded once per device.
  DeviceConstants codebook_;
  Projection projection_;
};

// The LFQ keys lfq and residual_lfq share (entropy_loss_weight,
// commitment_loss_weight, diversity_gamma, inv_temperature, codebook_scale),
// checked with o.codebook_size (which the caller read); `type` names the type in errors.
void read_lfq_keys(ConfigSection& s, LFQOptions& o, const std::string& type);
// The reference's LFQ defaults where ours differ: commitment_loss_weight 0
// there, 0.25 here as in MAGVIT-v2.
void lfq_reference_defaults(LFQOptions& o);
// The reference's constant buffer (its bit weights 2^(d-1) .. 1, `mask`).
bool is_lfq_constant(const std::string& name);

}  // namespace vqddp
