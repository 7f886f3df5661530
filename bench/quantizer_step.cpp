// One training step (quantize + backward of loss and a reconstruction
// term) of every factory type at N = 16384 rows of width 64, codebooks of
// 1024 codes, against VectorQuantize at the same size in the same run.
// Residual and grouped types run 4 layers (grouped: 2 groups of 32 wide), so
// their ratio is per 4 codebooks; FSQ-family types use levels 8-8-8-2
// (1024 codes), LFQ-family 1024 codes (10 bits, projected).
//
// Not a test: it prints milliseconds per step and the ratio to `vq`.
// usage: bench_quantizer_step [N]
#include <fmt/format.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "bench/timing.h"
#include "comm/single.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "vq/quantizer_kind.h"
#include "vq/quantizer_options.h"

using namespace vqddp;

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 16384, dim = 64;
  SingleCommunicator comm;
  Generator data(1, 0);
  Tensor x = rand_normal({n, dim}, data);
  double vq_ms = 0;
  // Every type, then vq with each option that changes a step's work.
  // Each type's test keys at the sizes of a real step: 1024 codes, 4
  // layers, 2 groups, levels 8 8 8 2, and no k-means (the steady-state step,
  // not the one-off init), revival or dropout.
  auto sized = [](const std::string& type, const nlohmann::json& more) {
    nlohmann::json j = quantizer_kind(type).test_keys;
    for (const char* key : {"threshold_ema_dead_code", "quantize_dropout", "kmeans_iters"}) j.erase(key);
    if (j.contains("codebook_size")) j["codebook_size"] = 1024;
    if (j.contains("num_quantizers")) j["num_quantizers"] = 4;
    if (j.contains("levels")) j["levels"] = {8, 8, 8, 2};
    if (j.contains("kmeans_init")) j["kmeans_init"] = false;
    j["type"] = type;
    for (const auto& [key, value] : more.items()) j[key] = value;
    return parse_quantizer_options(j);
  };
  std::vector<std::pair<std::string, QuantizerOptions>> runs;
  for (const std::string& type : quantizer_types()) runs.emplace_back(type, sized(type, nlohmann::json::object()));
  runs.emplace_back("vq stochastic_sample_codes", sized("vq", {{"stochastic_sample_codes", true}}));
  runs.emplace_back("vq commitment_use_ce", sized("vq", {{"commitment_use_cross_entropy_loss", true}}));
  runs.emplace_back("vq learnable", sized("vq", {{"learnable_codebook", true}}));
  runs.emplace_back("vq learnable+orthogonal_reg",
                    sized("vq", {{"learnable_codebook", true},
                                 {"orthogonal_reg_weight", 1.0},
                                 {"orthogonal_reg_active_codes_only", true},
                                 {"orthogonal_reg_max_codes", 256}}));
  runs.emplace_back("residual_vq beam_size 2", sized("residual_vq", {{"beam_size", 2}}));
  for (const auto& [name, q] : runs) {
    Generator init(0, 0);
    std::shared_ptr<Quantizer> m = make_quantizer(q, dim, 1, init);
    m->train();
    auto step = [&] {
      Tensor xr = x.clone();
      xr.set_requires_grad(true);
      QuantizerOutput out = m->quantize(xr, comm);
      Tensor loss = add(mean(square(out.quantized)), out.loss);
      if (loss.requires_grad()) loss.backward();  // targets only (random_projection): no gradient
      m->zero_grad();
    };
    step();  // warm-up (and any first-step initialisation)
    double ms = bench::median_ms(step, 5);
    if (name == "vq") vq_ms = ms;
    fmt::print("{:30s} N={} dim={} codebooks {} x {:4d}: {:8.2f} ms per training step ({:.2f}x vq)\n", name, n, dim,
               m->layer_sizes().size(), m->layer_sizes()[0], ms, vq_ms > 0 ? ms / vq_ms : 0.0);
  }
}
