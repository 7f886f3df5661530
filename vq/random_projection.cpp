#include "vq/random_projection.h"

#include <cmath>

#include "engine/autograd.h"
#include "engine/core/count_limits.h"
#include "engine/ops.h"
#include "vq/quantizer_registry.h"

namespace vqddp {

VectorQuantizeOptions RandomProjectionQuantizer::codebook_options(const RandomProjectionOptions& o) {
  VectorQuantizeOptions v;
  v.dim = o.codebook_dim * o.num_codebooks;
  v.codebook_dim = v.dim;  // the reference's VectorQuantize default: each head as wide as its input
  v.heads = o.num_codebooks;
  v.separate_codebook_per_head = true;
  v.codebook_size = o.codebook_size;
  v.codebook.cosine = true;
  v.codebook.kmeans_init = false;  // random codes: nothing ever trains them
  v.seed = o.seed;
  return v;
}

RandomProjectionQuantizer::RandomProjectionQuantizer(const RandomProjectionOptions& options, Generator& init_gen)
    : opt_(options) {
  VQDDP_CHECK(opt_.dim > 0 && opt_.codebook_dim > 0 && opt_.num_codebooks >= 1,
              "RandomProjectionQuantizer: dim {}, codebook_dim {} and num_codebooks {} must be positive", opt_.dim,
              opt_.codebook_dim, opt_.num_codebooks);
  // torch's xavier_normal_ on (num_codebooks, dim, codebook_dim): fan_in =
  // dim * codebook_dim, fan_out = num_codebooks * codebook_dim.
  const int64_t h = opt_.num_codebooks, d = opt_.dim, e = opt_.codebook_dim;
  const double std = std::sqrt(2.0 / static_cast<double>(e * (d + h)));
  Tensor p = empty({h, d, e});
  float* v = p.data<float>();
  for (int64_t i = 0; i < p.numel(); ++i) v[i] = static_cast<float>(std * init_gen.normal());
  rand_projs_ = register_buffer("rand_projs", p);
  if (opt_.norm) norm_ = std::make_shared<LayerNorm>(d, 1e-5f, /*affine=*/false);
  vq_ = register_module("vq", std::make_shared<VectorQuantize>(codebook_options(opt_), init_gen));
}

Tensor RandomProjectionQuantizer::projections() const {
  const int64_t h = opt_.num_codebooks, d = opt_.dim, e = opt_.codebook_dim;
  return reshape(transpose(rand_projs_, 0, 1), {d, h * e});  // (dim, h, e): column h*e + j is head h's j
}

QuantizerOutput RandomProjectionQuantizer::quantize(const Tensor& x, Communicator& comm, const Tensor& mask) {
  refuse_mask(mask, "RandomProjectionQuantizer", comm.rank());
  VQDDP_CHECK(x.defined() && x.dim() == 2 && x.size(1) == opt_.dim,
              "rank {}: RandomProjectionQuantizer expects [N, {}], got {}", comm.rank(), opt_.dim, x.desc());
  NoGradGuard no_grad;  // targets: nothing here learns or passes a gradient on
  vq_->eval();          // the reference holds its VectorQuantize in eval(): the codebooks never change
  Tensor z = matmul(norm_ ? norm_->forward(x) : x, projections());
  QuantizerOutput codes = vq_->quantize(z, comm);
  // decode(indices) without reading the indices back (a -1 check there).
  Tensor y = matmul(codes.quantized, projections(), /*transpose_a=*/false, /*transpose_b=*/true);
  return without_loss(y, codes.indices, opt_.num_codebooks);
}

Tensor RandomProjectionQuantizer::decode(const Tensor& indices) const {
  VQDDP_CHECK(indices.dtype() == DType::i64 && indices.dim() == 2 && indices.size(1) == opt_.num_codebooks,
              "decode: expected int64 indices [N, {}], got {}", opt_.num_codebooks, indices.desc());
  // The VectorQuantize's codes in the projections' space, carried back.
  return matmul(vq_->decode(indices), projections(), /*transpose_a=*/false, /*transpose_b=*/true);
}

std::vector<int64_t> RandomProjectionQuantizer::layer_sizes() const {
  return std::vector<int64_t>(opt_.num_codebooks, opt_.codebook_size);
}

// ---- the "random_projection" kind (vq/quantizer_kind.h) --------------------------

namespace {

void read_random_projection(ConfigSection& s, RandomProjectionOptions& o, int64_t dim) {
  o.codebook_size = s.integer("codebook_size", o.codebook_size, limits::codebook_size);
  o.codebook_dim = s.integer("codebook_dim", o.codebook_dim, limits::codebook_dim);
  if (o.codebook_dim == 0) s.fail("codebook_dim", "is required for type \"random_projection\" (each projection's width)");
  o.num_codebooks = static_cast<int>(s.integer("num_codebooks", o.num_codebooks, limits::heads));
  o.norm = s.boolean("norm", o.norm);
  const int64_t heads = o.num_codebooks, wide = o.codebook_dim * heads;
  s.check_elements("codebook_size", "codebook_size x codebook_dim x num_codebooks^2", {o.codebook_size, wide, heads});
  if (dim > 0) s.check_elements("codebook_dim", "dim x codebook_dim x num_codebooks", {dim, wide});
}

}  // namespace

const QuantizerKind& random_projection_kind() {
  static const QuantizerKind kind = [] {
    QuantizerKind k =
        make_kind<RandomProjectionQuantizer, RandomProjectionOptions>("random_projection", {}, read_random_projection);
    k.trains_encoder = false;
    k.test_keys = {{"codebook_size", 16}, {"codebook_dim", 4}, {"num_codebooks", 2}};
    k.reference_class = "RandomProjectionQuantizer";
    // Its VectorQuantize's state under "vq.", named as VectorQuantize names it.
    k.reference_slots = [](const QuantizerOptions& q, const std::string& ours) {
      if (!ours.starts_with("vq.")) return std::vector<ReferenceSlot>{{ours, ours}};
      const QuantizerOptions inner("vq", RandomProjectionQuantizer::codebook_options(q.as<RandomProjectionOptions>()));
      return nested_slots(vector_quantize_kind(), inner, "vq.", ours.substr(3));
    };
    return k;
  }();
  return kind;
}

}  // namespace vqddp
