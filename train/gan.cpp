#include "train/gan.h"

#include "engine/autograd.h"
#include "engine/core/random.h"
#include "engine/core/streams.h"
#include "engine/ops.h"
#include "vq/losses.h"

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

Tensor discriminator_loss(const std::vector<DiscriminatorOutput>& real, const std::vector<DiscriminatorOutput>& fake,
                          const std::string& kind, Communicator& comm) {
  check_pairs(real, fake, "discriminator_loss");
  Tensor total;
  for (size_t d = 0; d < real.size(); ++d) {
    const Tensor &r = real[d].logits, &f = fake[d].logits;
    Tensor term = kind == "hinge" ? add(mean_or_zero(relu(one_minus(r)), comm), mean_or_zero(relu(add(f, 1.f)), comm))
                                  : add(mean_or_zero(square(one_minus(r)), comm), mean_or_zero(square(f), comm));
    total = accumulate(total, term);
  }
  return div(total, static_cast<float>(real.size()));
}

Tensor generator_loss(const std::vector<DiscriminatorOutput>& fake, const std::string& kind, Communicator& comm) {
  VQDDP_CHECK(!fake.empty(), "generator_loss: no discriminator outputs");
  Tensor total;
  for (const DiscriminatorOutput& o : fake)
    total = accumulate(total, kind == "hinge" ? mean_or_zero(relu(one_minus(o.logits)), comm)
                                              : mean_or_zero(square(one_minus(o.logits)), comm));
  return div(total, static_cast<float>(fake.size()));
}

Tensor feature_matching_loss(const std::vector<DiscriminatorOutput>& real,
                             const std::vector<DiscriminatorOutput>& fake, Communicator& comm) {
  check_pairs(real, fake, "feature_matching_loss");
  Tensor total;
  for (size_t d = 0; d < real.size(); ++d) {
    VQDDP_CHECK(real[d].features.size() == fake[d].features.size(), "feature_matching_loss: discriminator {} has {} "
                "real and {} generated feature maps", d, real[d].features.size(), fake[d].features.size());
    for (size_t l = 0; l < real[d].features.size(); ++l) {
      Tensor r = real[d].features[l].detach();
      Tensor scale = mean_or_zero(abs(r), comm);  // a global-batch quantity: the same on every rank
      total = accumulate(total, div(mean_or_zero(abs(sub(fake[d].features[l], r)), comm), scale));
    }
  }
  return div(total, static_cast<float>(real.size()));
}

bool adversarial_step(const GanConfig& gan, int64_t step) { return gan.enabled && step > gan.warmup_steps; }

bool discriminator_updates(const GanConfig& gan, uint64_t seed, int64_t step) {
  if (!adversarial_step(gan, step) || step % gan.update_every != 0) return false;
  if (gan.update_probability >= 1) return true;
  Generator draw(seed, streams::kDiscriminatorUpdate + static_cast<uint64_t>(step));
  return draw.uniform() < gan.update_probability;
}

}  // namespace vqddp
