// LatentQuantize (vq/latent_quantize.h): latents snapped to the reference's
// grid, mixed-radix indices, decode(indices) == the output, and the two
// losses of the reference.
#include <doctest/doctest.h>

#include <cmath>

#include "comm/single.h"
#include "engine/ops.h"
#include "tests/vq/harness.h"
#include "vq/latent_quantize.h"

using namespace vqddp;

TEST_CASE("LatentQuantize snaps each latent to the nearest grid value (odd: linspace(-0.5, 0.5, L), even: k/L - 0.5), "
          "indexes it mixed-radix, decodes to the same output, and weighs the reference's two losses") {
  LatentQuantizeOptions o;
  o.levels = {3, 4};
  o.num_codebooks = 2;
  o.commitment_loss_weight = 0.3f;
  o.quantization_loss_weight = 0.2f;
  Generator init(0, 0), data(2, 0);
  LatentQuantize lq(o, init);
  lq.train();
  SingleCommunicator comm;
  Tensor x = mul(rand_normal({10, 4}, data), 0.4f);  // dim 4 == 2 latents x 2 codebooks: no projection
  QuantizerOutput out = lq.quantize(x, comm);
  const std::vector<float> xs = x.to_vector<float>(), q = out.quantized.detach().to_vector<float>();
  const std::vector<int64_t> idx = out.indices.to_vector<int64_t>();
  const std::vector<std::vector<float>> grid = {{-0.5f, 0.f, 0.5f}, {-0.5f, -0.25f, 0.f, 0.25f}};
  double sq = 0;
  for (int n = 0; n < 10; ++n)
    for (int b = 0; b < 2; ++b) {
      int64_t want = 0, place = 1;
      for (int j = 0; j < 2; ++j) {
        const float v = xs[n * 4 + b * 2 + j];
        int best = 0;
        for (int k = 1; k < static_cast<int>(grid[j].size()); ++k)
          if (std::fabs(v - grid[j][k]) < std::fabs(v - grid[j][best])) best = k;
        CHECK(q[n * 4 + b * 2 + j] == grid[j][best]);
        want += best * place;
        place *= static_cast<int64_t>(grid[j].size());
        sq += std::pow(double(v) - grid[j][best], 2);
      }
      CHECK(idx[n * 2 + b] == want);
    }
  CHECK(out.loss.item<float>() == doctest::Approx((0.3 + 0.2) * sq / 40).epsilon(1e-5));
  CHECK(test::first_difference({{"q", lq.decode(out.indices)}}, {{"q", out.quantized.detach()}}) == "");
  lq.eval();
  CHECK(lq.quantize(x, comm).loss.item<float>() == 0.f);
}
