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
#include "vq/quantizer_options.h"

using namespace vqddp;

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 16384, dim = 64;
  SingleCommunicator comm;
  Generator data(1, 0);
  Tensor x = rand_normal({n, dim}, data);
  double vq_ms = 0;
  // Every type, then vq with each option that changes a step's work.
  std::vector<std::pair<std::string, QuantizerOptions>> runs;
  for (const std::string& type : quantizer_types()) {
    QuantizerOptions q;
    q.type = type;
    runs.emplace_back(type, q);
  }
  auto vq_with = [&](const std::string& name, auto set) {
    QuantizerOptions q;
    q.type = "vq";
    set(q);
    runs.emplace_back("vq " + name, q);
  };
  vq_with("stochastic_sample_codes", [](QuantizerOptions& q) { q.codebook.stochastic_sample = true; });
  vq_with("commitment_use_ce", [](QuantizerOptions& q) { q.commitment_use_cross_entropy_loss = true; });
  vq_with("learnable", [](QuantizerOptions& q) { q.codebook.learnable = true; });
  vq_with("learnable+orthogonal_reg", [](QuantizerOptions& q) {
    q.codebook.learnable = true;
    q.orthogonal_reg_weight = 1.f;
    q.orthogonal_reg_active_codes_only = true;
    q.orthogonal_reg_max_codes = 256;
  });
  {
    QuantizerOptions q;
    q.type = "residual_vq";
    q.beam_size = 2;
    runs.emplace_back("residual_vq beam_size 2", q);
  }
  for (auto [name, q] : runs) {
    const std::string type = q.type;
    q.codebook_size = 1024;
    q.num_quantizers = 4;
    q.groups = 2;
    q.codebook.kmeans_init = false;  // the steady-state step, not the one-off init
    if (type.ends_with("fsq") || type == "fsp" || type == "latent_quantize") q.levels = {8, 8, 8, 2};
    Generator init(0, 0);
    std::shared_ptr<Quantizer> m = make_quantizer(q, dim, 1, init);
    m->train();
    auto step = [&] {
      Tensor xr = x.clone();
      xr.set_requires_grad(true);
      QuantizerOutput out = m->quantize(xr, comm);
      add(mean(square(out.quantized)), out.loss).backward();
      m->zero_grad();
    };
    step();  // warm-up (and any first-step initialisation)
    double ms = bench::median_ms(step, 5);
    if (name == "vq") vq_ms = ms;
    fmt::print("{:30s} N={} dim={} codebooks {} x {:4d}: {:8.2f} ms per training step ({:.2f}x vq)\n", name, n, dim,
               m->layer_sizes().size(), m->layer_sizes()[0], ms, vq_ms > 0 ? ms / vq_ms : 0.0);
  }
}
