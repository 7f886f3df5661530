// FSP: finite scalar perturbation (vector-quantize-pytorch's FSP,
// arXiv 2602.17133). Each scalar of z = project_in(x) (M, C), C = the
// number of levels, is mapped to [0, 1] by a CDF activation a(z) and
// binned:
//   l_j = floor(min(a, 1 - eps) * L_j)          (eps: float32's epsilon)
//   q_j = (l_j + 0.5) / L_j                      (straight-through to a)
// In a training step with quantize_rate r < 1 each scalar is instead, with
// probability 1 - r, its activation perturbed within half a bin:
//   p = a + (u1 * 2 - 1) / (2 L_j), kept where 0 < p < 1 (else a), used
//   where u2 > r.
// The output is (q - 0.5) / 0.28867513459481287 (unit variance), or with
// need_inv_act the inverse activation of q clamped to [eps, 1 - eps]
// (straight-through to z), then project_out. Index = sum_j l_j b_j (the
// unperturbed bins; b as FSQ's). The loss is the vector norm: weighted
// squared distances of the batch's per-dimension mean, unbiased variance,
// skewness and kurtosis (excess) from targets (preset `vector_norm`).
//
// DDP: in a training step the moments are the GLOBAL batch's (two sums
// over the global batch: the exact step's order, so W ranks on any split
// give 1 rank's loss and gradient), and the uniforms u1, u2 of global row g
// and column j are words 2 (g C + j) and 2 (g C + j) + 1 of one shared
// stream per step, so a row is perturbed alike on any split (the reference
// computes the moments per rank and draws per rank). Inference issues no
// collective: its moments are this rank's. Extras: "p_accept_prob" (the
// global fraction of proposals kept), in training steps that perturb.
#pragma once

#include <string>
#include <vector>

#include "engine/nn.h"
#include "vq/device_constants.h"
#include "vq/quantizer.h"

namespace vqddp {

struct FSPOptions {
  std::vector<int> levels;           // L_j, each >= 2
  int64_t dim = 0;                   // 0: levels.size() (no projection)
  std::string act_name = "tanh";     // tanh | sigmoid | normal | laplace | cauchy (normal: not with need_inv_act)
  float quantize_rate = 0.f;         // in [0, 1]; 1: never perturb
  bool need_inv_act = false;
  std::string vector_norm = "var_tanh";  // none | var | kurt | var_tanh | var_sigmoid | var_laplace
  uint64_t seed = 0;                 // keys the perturbation stream
  bool operator==(const FSPOptions&) const = default;
};

// The activations and presets FSP knows (the reference's names).
const std::vector<std::string>& fsp_activations();
const std::vector<std::string>& fsp_vector_norms();

class FSP : public Quantizer {
 public:
  FSP(const FSPOptions& options, Generator& init_gen);

  QuantizerOutput quantize(const Tensor& x, Communicator& comm, const Tensor& mask = Tensor()) override;
  Tensor decode(const Tensor& indices) const override;
  std::vector<int64_t> layer_sizes() const override { return {codebook_size_}; }
  int64_t dim() const override { return opt_.dim; }

 private:
  Tensor activation(const Tensor& z) const;
  Tensor inverse_activation(const Tensor& p) const;
  // The scalar output of bin values q (M, C), before project_out.
  Tensor output_of(const Tensor& q, const Tensor& z) const;
  // The uniforms of this rank's rows this step: (M, C) each.
  void perturbation_noise(int64_t rows, Communicator& comm, Tensor& offset, Tensor& use) ;

  FSPOptions opt_;
  int64_t codebook_size_ = 1;
  DeviceConstants constants_;
  size_t levels_f_ = 0, half_bin_ = 0, ones_ = 0, levels_ = 0, basis_ = 0;
  std::vector<float> half_bins_;  // 1 / (2 L_j), host
  Projection projection_;
  Tensor step_;  // int64 (1): training steps that perturbed so far (the stream id's offset)
};

}  // namespace vqddp
