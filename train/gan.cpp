#include "train/gan.h"

#include "engine/autograd.h"
#include "engine/core/random.h"
#include "engine/core/streams.h"
#include "engine/nn_conv.h"
#include "engine/op_profile.h"
#include "engine/ops.h"
#include "comm/batch_reduce.h"

namespace vqddp {

namespace {

Tensor one_minus(const Tensor& x) { return add(neg(x), 1.f); }

Tensor accumulate(const Tensor& total, const Tensor& term) { return total.defined() ? add(total, term) : term; }

void check_pairs(const std::vector<DiscriminatorOutput>& real, const std::vector<DiscriminatorOutput>& fake,
                 const char* what) {
  VQDDP_CHECK(!fake.empty() && real.size() == fake.size(), "{}: {} real and {} generated discriminator outputs", what,
              real.size(), fake.size());
}

}  // namespace

// Each loss is a sum of global-batch means taken in one collective
// (batch_means), then added in the order listed.
Tensor discriminator_loss(const std::vector<DiscriminatorOutput>& real, const std::vector<DiscriminatorOutput>& fake,
                          const std::string& kind, Communicator& comm) {
  check_pairs(real, fake, "discriminator_loss");
  std::vector<Tensor> terms;
  for (size_t d = 0; d < real.size(); ++d) {
    const Tensor &r = real[d].logits, &f = fake[d].logits;
    if (kind == "hinge")
      terms.insert(terms.end(), {relu(one_minus(r)), relu(add(f, 1.f))});
    else
      terms.insert(terms.end(), {square(one_minus(r)), square(f)});
  }
  const std::vector<Tensor> means = batch_means(terms, comm);
  Tensor total;
  for (size_t d = 0; d < real.size(); ++d) total = accumulate(total, add(means[2 * d], means[2 * d + 1]));
  return div(total, static_cast<float>(real.size()));
}

Tensor generator_loss(const std::vector<DiscriminatorOutput>& fake, const std::string& kind, Communicator& comm) {
  VQDDP_CHECK(!fake.empty(), "generator_loss: no discriminator outputs");
  std::vector<Tensor> terms;
  for (const DiscriminatorOutput& o : fake)
    terms.push_back(kind == "hinge" ? relu(one_minus(o.logits)) : square(one_minus(o.logits)));
  Tensor total;
  for (const Tensor& m : batch_means(terms, comm)) total = accumulate(total, m);
  return div(total, static_cast<float>(fake.size()));
}

Tensor feature_matching_loss(const std::vector<DiscriminatorOutput>& real,
                             const std::vector<DiscriminatorOutput>& fake, Communicator& comm) {
  check_pairs(real, fake, "feature_matching_loss");
  // Per feature map: mean |f(y) - f(x)| and the scale mean |f(x)|, a
  // global-batch quantity (the same on every rank).
  std::vector<Tensor> terms;
  for (size_t d = 0; d < real.size(); ++d) {
    VQDDP_CHECK(real[d].features.size() == fake[d].features.size(), "feature_matching_loss: discriminator {} has {} "
                "real and {} generated feature maps", d, real[d].features.size(), fake[d].features.size());
    for (size_t l = 0; l < real[d].features.size(); ++l) {
      Tensor r = real[d].features[l].detach();
      terms.insert(terms.end(), {abs(sub(fake[d].features[l], r)), abs(r)});
    }
  }
  const std::vector<Tensor> means = batch_means(terms, comm);
  Tensor total;
  for (size_t i = 0; i < means.size(); i += 2) total = accumulate(total, div(means[i], means[i + 1]));
  return div(total, static_cast<float>(real.size()));
}

bool adversarial_step(const GanConfig& gan, int64_t step) { return gan.enabled && step > gan.warmup_steps; }

bool discriminator_updates(const GanConfig& gan, uint64_t seed, int64_t step) {
  if (!adversarial_step(gan, step) || step % gan.update_every != 0) return false;
  if (gan.update_probability >= 1) return true;
  Generator draw(seed, streams::kDiscriminatorUpdate + static_cast<uint64_t>(step));
  return draw.uniform() < gan.update_probability;
}

GanPart::GanPart(const GanConfig& gan, int64_t example_length, double sample_rate, uint64_t seed, Device device)
    : gan_(gan), module_(gan, example_length, sample_rate, seed) {
  module_.to(device);  // before the optimizer, whose moments are allocated beside the parameters
  params_ = module_.parameters();
  optim_ = make_optimizer(gan.optimizer, params_);
}

TrainedPart GanPart::part() { return {"discriminators", "discriminator.", module_, *optim_}; }

Tensor GanPart::discriminator_loss(const Tensor& x, const Tensor& y, Communicator& comm) {
  WeightNormBatch weights(module_);
  std::vector<DiscriminatorOutput> real = module_.forward(x), fake = module_.forward(y.detach());
  return vqddp::discriminator_loss(real, fake, gan_.loss, comm);
}

void GanPart::learn(const Tensor& loss, int64_t step, int64_t total_steps) {
  loss.backward();
  op_profile_mark("step: discriminator backward");
  update_part("discriminators", *optim_, params_, gan_.optimizer, step, total_steps);
}

GanPart::CodecLosses GanPart::codec_losses(const Tensor& x, const Tensor& y, Communicator& comm) {
  struct Frozen {
    std::vector<Tensor>& params;
    explicit Frozen(std::vector<Tensor>& p) : params(p) { for (Tensor& t : params) t.set_requires_grad(false); }
    ~Frozen() { for (Tensor& t : params) t.set_requires_grad(true); }
  } frozen(params_);
  WeightNormBatch weights(module_);
  std::vector<DiscriminatorOutput> real;
  {
    NoGradGuard no_grad;
    real = module_.forward(x);
  }
  std::vector<DiscriminatorOutput> fake = module_.forward(y);
  CodecLosses out;
  out.adversarial = generator_loss(fake, gan_.loss, comm);
  out.feature = feature_matching_loss(real, fake, comm);
  out.total = add(mul(out.adversarial, static_cast<float>(gan_.adversarial_weight)),
                  mul(out.feature, static_cast<float>(gan_.feature_weight)));
  op_profile_mark("step: adversarial losses");
  return out;
}

}  // namespace vqddp
