// The quantizers of the device-resident tests, one training step each
// (every factory type, then variants):
// shared by tests/vq/test_device_resident.cpp (sim against the CPU) and the
// GPU suite (cuda against the CPU, tests/cuda/test_vq.cpp).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/device_counters.h"
#include "engine/ops.h"
#include "engine/core/random.h"
#include "tests/vq/harness.h"
#include "tests/vq/factory_options.h"
#include "vq/codebook.h"
#include "vq/fsq.h"
#include "vq/lfq.h"
#include "vq/residual_fsq.h"
#include "vq/residual_vq.h"
#include "vq/vector_quantize.h"

namespace vqddp::test {


// One quantizer under test: makes the module, and runs one training step on
// x (forward, then backward of a loss that reaches every input), returning
// what the step produced (quantized rows and indices, on x's device).
struct Case {
  std::string name;
  std::function<std::shared_ptr<Module>(Generator&)> make;
  std::function<std::vector<Tensor>(Module&, const Tensor&, Communicator&)> step;
  // The step copies to the host and back, as documented for it
  // (stochastic_sample_codes draws on the host: vq/gumbel_sample.h).
  bool reads_back = false;
};

inline Tensor step_loss(const Tensor& quantized, const Tensor& loss) { return add(mean(square(quantized)), loss); }

inline std::vector<Case> quantizer_cases() {
  std::vector<Case> out;
  // Every case runs through the one Quantizer contract.
  auto add = [&](std::string name, std::function<std::shared_ptr<Module>(Generator&)> make) {
    out.push_back({std::move(name), std::move(make), [](Module& m, const Tensor& x, Communicator& comm) {
                     QuantizerOutput o = static_cast<Quantizer&>(m).quantize(x, comm);
                     Tensor loss = step_loss(o.quantized, o.loss);
                     if (loss.requires_grad()) loss.backward();  // targets only (random_projection): no gradient
                     return std::vector<Tensor>{o.quantized.detach(), o.indices};
                   }});
  };
  // Every type the factory makes, so a new type is covered on sim and on
  // the GPU the day it joins quantizer_types().
  for (const std::string& type : quantizer_types()) {
    const QuantizerOptions q = options_for(type);
    add("factory type " + type, [q](Generator& g) { return make_quantizer(q, /*dim=*/8, /*seed=*/5, g); });
  }
  // Variants the factory's options do not reach: heads, cosine and
  // learnable codebooks, quantize dropout with revival.
  auto vq_case = [&](std::string name, VectorQuantizeOptions o) {
    add(std::move(name), [o](Generator& g) { return std::make_shared<VectorQuantize>(o, g); });
  };
  VectorQuantizeOptions heads;
  heads.dim = 8;
  heads.codebook_size = 16;
  heads.heads = 2;
  heads.codebook.kmeans_iters = 3;
  heads.codebook.threshold_ema_dead_code = 2.f;
  vq_case("VectorQuantize, 2 heads, EMA, k-means, revival", heads);
  VectorQuantizeOptions straight = heads;
  straight.rotation_trick = false;
  vq_case("VectorQuantize, 2 heads, straight-through", straight);
  VectorQuantizeOptions sampled = heads;
  sampled.codebook.stochastic_sample = true;
  vq_case("VectorQuantize, 2 heads, stochastic_sample_codes", sampled);
  out.back().reads_back = true;
  VectorQuantizeOptions frozen = heads;
  frozen.freeze_codebook = true;
  frozen.codebook_diversity_loss_weight = 0.5f;
  vq_case("VectorQuantize, frozen codebook, diversity loss", frozen);
  VectorQuantizeOptions normed = heads;
  normed.codebook_dim = 3;  // project_in to 2 x 3, then the LayerNorm
  normed.layernorm_after_project_in = true;
  vq_case("VectorQuantize, LayerNorm after project_in", normed);
  VectorQuantizeOptions cosine = heads;
  cosine.heads = 1;
  cosine.codebook.cosine = true;
  cosine.codebook.learnable = true;
  cosine.codebook.kmeans_init = false;
  vq_case("VectorQuantize, cosine, learnable", cosine);
  VectorQuantizeOptions ema_cosine = heads;
  ema_cosine.separate_codebook_per_head = true;
  ema_cosine.codebook.cosine = true;
  vq_case("VectorQuantize, separate cosine EMA codebooks per head", ema_cosine);

  ResidualVQOptions r;
  r.dim = 8;
  r.num_quantizers = 3;
  r.codebook_size = 16;
  r.quantize_dropout.enabled = true;
  r.codebook.kmeans_iters = 3;
  r.codebook.threshold_ema_dead_code = 2.f;
  add("ResidualVQ with quantize dropout, EMA, revival", [r](Generator& g) { return std::make_shared<ResidualVQ>(r, g); });

  FSQOptions f{{8, 5, 5}, 8, 1};
  add("FSQ", [f](Generator& g) { return std::make_shared<FSQ>(f, g); });
  ResidualFSQOptions rf;
  rf.levels = {8, 5, 5};
  rf.num_quantizers = 3;
  rf.dim = 8;
  rf.quantize_dropout.enabled = true;
  add("ResidualFSQ with quantize dropout", [rf](Generator& g) { return std::make_shared<ResidualFSQ>(rf, g); });
  LFQOptions l;
  l.dim = 8;
  l.codebook_size = 64;
  add("LFQ", [l](Generator& g) { return std::make_shared<LFQ>(l, g); });
  return out;
}

struct RankRun {
  NamedTensors state;                // after every step, on the host
  std::vector<Tensor> last_outputs;  // of the last step, on the host
  std::vector<DeviceCounters> counts;  // per step
};

// `steps` training steps of `c` on W thread ranks, each rank's share of a
// fixed batch per step, on `device`.
inline std::vector<RankRun> run_case(const Case& c, Device device, int w, int steps) {
  const int64_t n = 24;
  std::vector<int64_t> sizes = split_sizes(n, w, "uneven");
  return per_rank(w, [&](Communicator& comm) {
    Generator init(7, 0);
    std::shared_ptr<Module> m = c.make(init);
    m->to(device);
    m->train();
    RankRun run;
    for (int s = 0; s < steps; ++s) {
      Generator data(100 + s, 0);
      Tensor x = shard(rand_normal({n, 8}, data), sizes, comm.rank()).to(device);
      x.set_requires_grad(true);  // the backward reaches the input, as an encoder's would
      m->zero_grad();
      reset_device_counters();
      std::vector<Tensor> outs = c.step(*m, x, comm);
      run.counts.push_back(device_counters());
      if (s + 1 == steps)
        for (const Tensor& t : outs) run.last_outputs.push_back(t.to(Device::cpu()));
    }
    run.state = m->state_copy(Device::cpu());
    return run;
  });
}


}  // namespace vqddp::test
