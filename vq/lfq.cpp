#include "vq/lfq.h"

#include <cmath>

#include <fmt/format.h>

#include "comm/batch_reduce.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "vq/losses.h"
#include "vq/kernels/vq_kernels.h"
#include "engine/core/count_limits.h"
#include "vq/quantizer_kind.h"

namespace vqddp {

LFQ::LFQ(const LFQOptions& o, Generator& init_gen) : opt_(o) {
  VQDDP_CHECK(lfq_codebook_size_ok(o.codebook_size),
              "LFQ: codebook_size {} must be a power of two in [2, 65536]", o.codebook_size);
  bits_ = 0;
  while ((int64_t{1} << bits_) < o.codebook_size) ++bits_;
  if (opt_.dim == 0) opt_.dim = bits_;
  projection_ = make_projection(opt_.dim, bits_, init_gen);
  codebook_.add(codes_of(arange(o.codebook_size)));
}

Tensor LFQ::codes_of(const Tensor& indices) const {
  Tensor out = empty({indices.numel(), bits_}, DType::f32, indices.device());
  vq_kernels(indices.device()).lfq_codes(indices, opt_.codebook_scale, out);
  return out;
}

QuantizerOutput LFQ::quantize(const Tensor& x, Communicator& comm, const Tensor& mask) {
  refuse_mask(mask, "LFQ", comm.rank());
  VQDDP_CHECK(x.defined() && x.dtype() == DType::f32 && x.dim() == 2 && x.size(1) == opt_.dim,
              "rank {}: LFQ expects float32 [N, {}], got {}", comm.rank(), opt_.dim, x.desc());
  Tensor z = projection_.in(x);  // (N, B)
  int64_t n = z.size(0);
  const Device dev = z.device();
  Tensor idx = empty({n}, DType::i64, dev);
  vq_kernels(dev).lfq_indices(z.detach(), idx);
  Tensor q = codes_of(idx);           // (N, B)
  Tensor st = straight_through(z, q);  // straight-through
  QuantizerOutput out;
  out.indices = as_columns(idx);
  out.quantized = projection_.out(st);
  out.active_layers = 1;
  const Tensor zero = full({}, 0.f, DType::f32, dev);
  out.extras = {{"entropy_loss", zero}, {"commitment_loss", zero}};
  out.loss = zero;
  out.layer_losses = {zero};
  if (!updates_state()) return out;

  Tensor logits = mul(matmul(z, codebook_.on(0, dev), false, true), 2.f * opt_.inv_temperature);  // (N, 2^B)
  Tensor p = softmax_rows(logits);
  Tensor per_sample = global_mean_or_zero(entropy_rows(p), comm);
  Tensor codebook_entropy = entropy_rows(global_row_mean(p, comm));  // one collective
  Tensor entropy_loss = sub(per_sample, mul(codebook_entropy, opt_.diversity_gamma));
  Tensor commitment_loss = global_mse_or_zero(z, q, comm);
  out.loss = add(mul(entropy_loss, opt_.entropy_loss_weight), mul(commitment_loss, opt_.commitment_weight));
  out.layer_losses = {out.loss};
  out.extras = {{"entropy_loss", entropy_loss},
                {"commitment_loss", commitment_loss},
                {"per_sample_entropy", per_sample.detach()},
                {"codebook_entropy", codebook_entropy.detach()}};
  return out;
}

Tensor LFQ::decode(const Tensor& indices) const {
  // Indices from outside: checked (one read on a device).
  check_index_range(indices.reshape({-1}), opt_.codebook_size, "LFQ");
  Tensor q = codes_of(indices.reshape({-1}));
  return projection_.out(q);
}

// ---- the "lfq" kind (vq/quantizer_kind.h) ----------------------------------------

void read_lfq_keys(ConfigSection& s, LFQOptions& o, const std::string& type) {
  o.entropy_loss_weight = static_cast<float>(s.number("entropy_loss_weight", o.entropy_loss_weight));
  o.commitment_weight = static_cast<float>(s.number("commitment_loss_weight", o.commitment_weight));
  o.diversity_gamma = static_cast<float>(s.number("diversity_gamma", o.diversity_gamma));
  o.inv_temperature = static_cast<float>(s.number("inv_temperature", o.inv_temperature));
  o.codebook_scale = static_cast<float>(s.number("codebook_scale", o.codebook_scale));
  if (!(o.entropy_loss_weight >= 0)) s.fail("entropy_loss_weight", "must not be negative");
  if (!(o.commitment_weight >= 0)) s.fail("commitment_loss_weight", "must not be negative");
  if (!(o.inv_temperature > 0)) s.fail("inv_temperature", "must be positive");
  if (!(o.codebook_scale > 0)) s.fail("codebook_scale", "must be positive");
  if (!lfq_codebook_size_ok(o.codebook_size))
    s.fail("codebook_size", fmt::format("must be a power of two in [2, 65536] for type \"{}\", got {}",
                                        section_type(s, type), o.codebook_size));
}

void lfq_reference_defaults(LFQOptions& o) { o.commitment_weight = 0.f; }

bool is_lfq_constant(const std::string& name) { return name == "mask" || name.ends_with(".mask"); }

namespace {

void read_lfq(ConfigSection& s, LFQOptions& o, int64_t) {
  o.codebook_size = s.integer("codebook_size", o.codebook_size, limits::codebook_size);
  read_lfq_keys(s, o, "lfq");
}

}  // namespace

const QuantizerKind& lfq_kind() {
  static const QuantizerKind kind = [] {
    LFQOptions defaults;
    defaults.codebook_size = 256;
    QuantizerKind k = make_kind<LFQ, LFQOptions>("lfq", defaults, read_lfq);
    k.test_keys = {{"codebook_size", 16}};
    k.reference_class = "LFQ";
    k.reference_defaults = [](QuantizerOptions& q, int64_t) { lfq_reference_defaults(q.as<LFQOptions>()); };
    k.reference_dim = [](const QuantizerOptions& q) {
      return static_cast<int64_t>(std::llround(std::log2(static_cast<double>(q.as<LFQOptions>().codebook_size))));
    };
    k.reference_constant = is_lfq_constant;
    return k;
  }();
  return kind;
}

}  // namespace vqddp
