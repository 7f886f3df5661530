#include "vq/sim_vq.h"

#include <cmath>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/core/random.h"
#include "vq/assign.h"
#include "vq/losses.h"
#include "vq/rotation_trick.h"
#include "engine/core/count_limits.h"
#include "vq/quantizer_kind.h"

namespace vqddp {

SimVQ::SimVQ(const SimVQOptions& o, Generator& init_gen) : opt_(o) {
  VQDDP_CHECK(o.dim > 0 && o.codebook_size >= 1 && o.frozen_codebook_dim >= 0,
              "SimVQ: dim {}, codebook_size {} and frozen_codebook_dim {} must be positive (0: dim)", o.dim,
              o.codebook_size, o.frozen_codebook_dim);
  if (opt_.frozen_codebook_dim == 0) opt_.frozen_codebook_dim = o.dim;
  const int64_t f = opt_.frozen_codebook_dim;
  // The order of the draws: the frozen codebook first, then W (the
  // reference's constructor order).
  frozen_ = register_buffer("frozen_codebook",
                            mul(rand_normal({o.codebook_size, f}, init_gen), static_cast<float>(1.0 / std::sqrt(double(f)))));
  transform_ = register_module("code_transform", std::make_shared<Linear>(f, o.dim, init_gen, /*bias=*/false));
}

Tensor SimVQ::codes() const {
  // The frozen codebook is the same on every rank, not a batch: marked
  // batch-free, so in an exact step W's gradient is summed over the batch's
  // units and not over the codebook's rows as if they were examples
  // (engine/exact_batch.h; check-ddp on examples/fashion_simvq.json caught
  // the difference).
  return transform_->forward(mark_batch_free(frozen_.to(transform_->weight.device())));
}

QuantizerOutput SimVQ::quantize(const Tensor& x, Communicator& comm, const Tensor& mask) {
  refuse_mask(mask, "SimVQ", comm.rank());
  VQDDP_CHECK(x.defined() && x.dtype() == DType::f32 && x.dim() == 2 && x.size(1) == opt_.dim,
              "rank {}: SimVQ expects float32 [N, {}], got {}", comm.rank(), opt_.dim, x.desc());
  Tensor codebook = codes();                                               // (K, dim)
  Tensor idx = assign_codes(x.detach(), codebook.detach(), /*cosine=*/false);  // (N)
  Tensor q = index_select(codebook, idx, Indices::trusted);                // (N, dim), gradient to W
  Tensor loss = add(global_mse_or_zero(x.detach(), q, comm),
                    mul(global_mse_or_zero(x, q.detach(), comm), opt_.input_to_quantize_commit_loss_weight));
  QuantizerOutput out;
  out.loss = mul(loss, opt_.commitment_weight);
  out.layer_losses = {out.loss};
  out.quantized = through_quantizer(x, q, opt_.rotation_trick);
  out.indices = as_columns(idx);
  out.active_layers = 1;
  return out;
}

Tensor SimVQ::decode(const Tensor& indices) const {
  VQDDP_CHECK(indices.dtype() == DType::i64 && (indices.dim() == 1 || (indices.dim() == 2 && indices.size(1) == 1)),
              "SimVQ decode: expected int64 indices [N] or [N, 1], got {}", indices.desc());
  Tensor flat = indices.reshape({-1});
  check_index_range(flat, opt_.codebook_size, "SimVQ");
  return index_select(codes().detach(), flat.to(transform_->weight.device()), Indices::trusted);
}

// ---- the "sim_vq" kind (vq/quantizer_kind.h) -------------------------------------

void read_sim_vq_keys(ConfigSection& s, SimVQOptions& o, int64_t dim, int64_t layers) {
  o.codebook_size = s.integer("codebook_size", o.codebook_size, limits::codebook_size);
  o.frozen_codebook_dim = s.integer("frozen_codebook_dim", o.frozen_codebook_dim, limits::codebook_dim);
  o.rotation_trick = s.boolean("rotation_trick", o.rotation_trick);
  o.commitment_weight = static_cast<float>(s.number("commitment_weight", o.commitment_weight));
  o.input_to_quantize_commit_loss_weight =
      static_cast<float>(s.number("input_to_quantize_commit_loss_weight", o.input_to_quantize_commit_loss_weight));
  if (!(o.commitment_weight >= 0)) s.fail("commitment_weight", "must not be negative");
  if (!(o.input_to_quantize_commit_loss_weight >= 0)) s.fail("input_to_quantize_commit_loss_weight", "must not be negative");
  if (dim > 0)  // each layer's frozen codebook
    s.check_elements("codebook_size", "codebook_size x frozen_codebook_dim x layers",
                     {o.codebook_size, o.frozen_codebook_dim > 0 ? o.frozen_codebook_dim : dim, layers});
}

namespace {

void read_sim_vq(ConfigSection& s, SimVQOptions& o, int64_t dim) { read_sim_vq_keys(s, o, dim, 1); }

}  // namespace

const QuantizerKind& sim_vq_kind() {
  static const QuantizerKind kind = [] {
    SimVQOptions defaults;
    defaults.codebook_size = 256;
    QuantizerKind k = make_kind<SimVQ, SimVQOptions>("sim_vq", defaults, read_sim_vq);
    k.test_keys = {{"codebook_size", 16}};
    k.reference_class = "SimVQ";
    return k;
  }();
  return kind;
}

}  // namespace vqddp
