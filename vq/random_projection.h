// RandomProjectionQuantizer: BEST-RQ's targets (Chiu et al. 2022,
// arXiv:2202.01855), as vector-quantize-pytorch builds them. Nothing in it
// learns: the input is layer-normalised without affine weights ("norm"),
// projected by num_codebooks frozen random matrices (each dim x
// codebook_dim, Xavier-normal: std sqrt(2 / (codebook_dim (dim +
// num_codebooks)))), and each projection is assigned its code in its own
// frozen random cosine codebook by a VectorQuantize held in inference mode.
// As in the reference that VectorQuantize is dim' = codebook_dim x
// num_codebooks wide with num_codebooks heads of dim' each, so for more
// than one codebook its random project_in widens the heads.
//
// The contract (vq/quantizer.h): indices (N, num_codebooks), the targets a
// model learns to predict; no loss, no metrics, no gradient, and no
// collective in any mode (the codebooks never change, so every rank's
// targets are its rows' alone). quantized is decode(indices): the codes
// carried back to the input width by the projections' transpose, with no
// gradient (the reference returns the indices only). It takes no mask. It
// cannot stand between a model's encoder and decoder (no gradient reaches
// the encoder): configs refuse it there; embedding programs and `replay`
// use it. State names: rand_projs (num_codebooks, dim, codebook_dim) and
// the VectorQuantize's under "vq.".
#pragma once

#include <memory>

#include "vq/quantizer.h"
#include "vq/vector_quantize.h"

namespace vqddp {

struct RandomProjectionOptions {
  int64_t dim = 0;
  int64_t codebook_size = 256;
  int64_t codebook_dim = 0;  // each projection's width; required (> 0)
  int num_codebooks = 1;
  bool norm = true;  // layer-normalise the input first (BEST-RQ, section 3)
  uint64_t seed = 0;
  bool operator==(const RandomProjectionOptions&) const = default;
};

class RandomProjectionQuantizer : public Quantizer {
 public:
  RandomProjectionQuantizer(const RandomProjectionOptions& options, Generator& init_gen);

  QuantizerOutput quantize(const Tensor& x, Communicator& comm, const Tensor& mask = Tensor()) override;
  Tensor decode(const Tensor& indices) const override;  // (N, num_codebooks) -> (N, dim)
  std::vector<int64_t> layer_sizes() const override;
  int64_t dim() const override { return opt_.dim; }

  // The VectorQuantize options the projections are assigned with.
  static VectorQuantizeOptions codebook_options(const RandomProjectionOptions& o);

 private:
  Tensor projections() const;  // rand_projs as (dim, num_codebooks * codebook_dim), head-major columns

  RandomProjectionOptions opt_;
  Tensor rand_projs_;
  std::shared_ptr<LayerNorm> norm_;
  std::shared_ptr<VectorQuantize> vq_;
};

}  // namespace vqddp
