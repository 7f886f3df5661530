// `vqddp replay` of whole quantizers described as vector-quantize-pytorch
// describes them (class, keyword arguments, state_dict names): the
// reference's layouts, W ranks == 1 rank bit for bit in every output, the
// input gradient against its closed form, and each malformed file named.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>

#include "engine/ops.h"
#include "engine/core/random.h"
#include "engine/core/safetensors.h"
#include "engine/core/streams.h"
#include "tests/engine/tmpdir.h"
#include "tool/reference_quantizer.h"
#include "tool/replay.h"

using namespace vqddp;
using vqddp::test::TempDir;

namespace {

using Meta = std::map<std::string, std::string>;
constexpr int kSteps = 3;
constexpr int64_t kRows = 24;

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.clone().raw_data(), b.clone().raw_data(), a.nbytes()) == 0;
}

// The state a module of `meta`'s class starts with, under the reference's
// names (what a PyTorch module's state_dict() gives), batches x.i and
// upstream gradients g.i.
NamedTensors input_for(const Meta& meta, bool gradients = true) {
  ReferenceQuantizer r = reference_quantizer(meta, "test");
  Generator init(7, streams::kInit);
  std::shared_ptr<Quantizer> m = make_quantizer(r.options, r.dim, 1, init);
  NamedTensors t = reference_state(*m, reference_slots(r.options, *m));
  for (int s = 0; s < kSteps; ++s) {
    Generator data(40 + s);
    t.emplace_back("x." + std::to_string(s), rand_normal({kRows, r.dim}, data));
    if (gradients) t.emplace_back("g." + std::to_string(s), rand_normal({kRows, r.dim}, data));
  }
  return t;
}

SafetensorsFile replay(const TempDir& dir, const NamedTensors& in, const Meta& meta, int world,
                       const std::string& shards = "") {
  const std::string i = dir.file("in.safetensors"), o = dir.file("out.safetensors");
  safetensors_save(i, in, meta);
  CHECK(run_replay({i, o, world, shards}) == kSteps);
  return safetensors_load(o);
}

struct Case {
  Meta meta;
  std::vector<std::pair<std::string, Shape>> layouts;  // some state names and shapes the reference gives
};

}  // namespace

TEST_CASE("replay of the reference's classes: its state names and layouts, and W ranks on any split == 1 rank bit "
          "for bit in outputs, losses, input and parameter gradients and state") {
  const std::vector<Case> cases = {
      {{{"class", "VectorQuantize"}, {"dim", "8"}, {"codebook_size", "16"}, {"heads", "2"},
        {"separate_codebook_per_head", "true"}, {"codebook_dim", "3"}, {"layernorm_after_project_in", "true"},
        {"decay", "0.9"}, {"threshold_ema_dead_code", "1"}, {"commitment_weight", "0.5"}},
       {{"_codebook.embed", {2, 16, 3}}, {"_codebook.cluster_size", {2, 16}}, {"_codebook.initted", {}},
        {"project_in.0.weight", {6, 8}}, {"project_in.1.weight", {6}}, {"project_out.weight", {8, 6}},
        {"vqddp.codebook1.draws", {1}}}},
      {{{"class", "VectorQuantize"}, {"dim", "8"}, {"codebook_size", "16"}, {"heads", "2"},
        {"separate_codebook_per_head", "true"}, {"affine_param", "true"}, {"rotation_trick", "false"}},
       // The reference's heads are codebook_dim = dim wide by default, projected 8 -> 2 x 8.
       {{"_codebook.batch_mean", {2, 1, 8}}, {"_codebook.codebook_variance", {2, 1, 8}}, {"project_in.weight", {16, 8}},
        {"_codebook.codebook_mean_needs_init", {}}, {"vqddp.codebook0.affine.batch_needs_init", {1}}}},
      {{{"class", "ResidualVQ"}, {"dim", "8"}, {"codebook_size", "16"}, {"num_quantizers", "2"},
        {"shared_codebook", "true"}, {"quantize_dropout", "true"}, {"codebook_diversity_loss_weight", "0.1"}},
       {{"layers.0._codebook.embed", {1, 16, 8}}, {"layers.1._codebook.embed_avg", {1, 16, 8}},
        {"vqddp.dropout_step", {1}}}},
      {{{"class", "GroupedResidualVQ"}, {"dim", "8"}, {"groups", "2"}, {"codebook_size", "16"},
        {"num_quantizers", "2"}},
       {{"rvqs.1.layers.0._codebook.embed", {1, 16, 4}}, {"rvqs.0.layers.1._codebook.initted", {}}}},
      {{{"class", "FSQ"}, {"dim", "8"}, {"levels", "[3, 5]"}}, {{"project_in.weight", {2, 8}}}},
      {{{"class", "GroupedResidualFSQ"}, {"dim", "8"}, {"groups", "2"}, {"levels", "[3, 3]"}, {"num_quantizers", "2"}},
       {{"rvqs.1.project_in.weight", {2, 4}}}},
      {{{"class", "ResidualLFQ"}, {"dim", "8"}, {"codebook_size", "16"}, {"num_quantizers", "2"}},
       {{"project_out.bias", {8}}}},
      {{{"class", "FSP"}, {"dim", "8"}, {"levels", "[3, 5, 4]"}, {"quantize_rate", "0.5"}},
       {{"project_in.weight", {3, 8}}, {"vqddp.perturb_step", {1}}}},
      {{{"class", "LatentQuantize"}, {"dim", "8"}, {"levels", "[3, 4]"}, {"num_codebooks", "2"}},
       {{"values_per_latent.1", {4}}, {"project_in.weight", {4, 8}}}},
      {{{"class", "SimVQ"}, {"dim", "8"}, {"codebook_size", "16"}},
       {{"frozen_codebook", {16, 8}}, {"code_transform.weight", {8, 8}}}},
      {{{"class", "ResidualSimVQ"}, {"dim", "8"}, {"codebook_size", "16"}, {"num_quantizers", "2"}},
       {{"layers.1.frozen_codebook", {16, 8}}}},
      // As the reference builds it: each head's cosine codebook codebook_dim x num_codebooks = 6 wide, behind a
      // project_in from 6 to 2 x 6.
      {{{"class", "RandomProjectionQuantizer"}, {"dim", "8"}, {"codebook_size", "16"}, {"codebook_dim", "3"},
        {"num_codebooks", "2"}},
       {{"rand_projs", {2, 8, 3}}, {"vq._codebook.embed", {2, 16, 6}}, {"vq.project_in.weight", {12, 6}},
        {"vq._codebook.initted", {}}}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.meta.at("class"));
    TempDir dir;
    NamedTensors in = input_for(c.meta);
    if (c.meta.at("class") == "ResidualLFQ")  // the reference's constant bit weights: accepted, not state
      in.emplace_back("layers.0.mask", full({4}, 1.0, DType::i64));
    if (c.meta.contains("affine_param"))  // None there before the first forward: absent from its state_dict
      std::erase_if(in, [](const auto& t) { return t.first == "_codebook.batch_mean" || t.first == "_codebook.batch_variance"; });
    SafetensorsFile one = replay(dir, in, c.meta, 1);
    for (const auto& [name, shape] : c.layouts) {
      CAPTURE(name);
      CHECK(one.at(name + ".2").shape() == shape);
    }
    CHECK(one.at("grad.x.0").shape() == Shape{kRows, 8});
    CHECK(one.metadata.at("world") == "1");
    SafetensorsFile three = replay(dir, in, c.meta, 3, "5,0,19;24,0,0;0,7,17");
    REQUIRE(three.tensors.size() == one.tensors.size());
    for (size_t i = 0; i < one.tensors.size(); ++i) {
      CAPTURE(one.tensors[i].first);
      CHECK(three.tensors[i].first == one.tensors[i].first);
      CHECK(same_bytes(three.tensors[i].second, one.tensors[i].second));
    }
  }
}

TEST_CASE("replay's input gradient is the gradient of sum(quantized * g) + loss: for VectorQuantize without the "
          "rotation trick, g + 2 w (x - q) / (N D); without g.i there is none") {
  TempDir dir;
  const Meta meta{{"class", "VectorQuantize"}, {"dim", "4"}, {"codebook_size", "8"}, {"rotation_trick", "false"},
                  {"commitment_weight", "0.5"}};
  NamedTensors in = input_for(meta);
  SafetensorsFile out = replay(dir, in, meta, 2);
  std::map<std::string, Tensor> x(in.begin(), in.end());
  for (int s = 0; s < kSteps; ++s) {
    CAPTURE(s);
    std::vector<float> xs = x.at("x." + std::to_string(s)).to_vector<float>(),
                       gs = x.at("g." + std::to_string(s)).to_vector<float>(),
                       q = out.at("quantized." + std::to_string(s)).to_vector<float>(),
                       grad = out.at("grad.x." + std::to_string(s)).to_vector<float>();
    for (size_t i = 0; i < xs.size(); ++i)
      CHECK(grad[i] == doctest::Approx(gs[i] + 2 * 0.5f * (xs[i] - q[i]) / (kRows * 4)).epsilon(1e-5));
    CHECK(out.at("indices." + std::to_string(s)).shape() == Shape{kRows, 1});
  }
  SafetensorsFile forward_only = replay(dir, input_for(meta, /*gradients=*/false), meta, 1);
  CHECK_FALSE(forward_only.contains("grad.x.0"));
  CHECK(forward_only.contains("loss.0"));
}

TEST_CASE("replay of a reference file: a wrong class, key, name or layout is named, and nothing is written") {
  TempDir dir;
  const std::string in = dir.file("in.safetensors"), out = dir.file("out.safetensors");
  const Meta meta{{"class", "ResidualVQ"}, {"dim", "8"}, {"codebook_size", "16"}, {"num_quantizers", "2"},
                  {"shared_codebook", "true"}};
  auto fails_with = [&](const NamedTensors& t, const Meta& m, const std::string& what) {
    safetensors_save(in, t, m);
    CHECK_THROWS_WITH_AS(run_replay({in, out, 2, ""}), doctest::Contains(what.c_str()), Error);
    CHECK_FALSE(std::filesystem::exists(out));
  };
  NamedTensors good = input_for(meta);
  auto with = [&](const std::string& key, const std::string& value) {
    Meta m = meta;
    m[key] = value;
    return m;
  };
  fails_with(good, with("class", "RVQ"), "in.safetensors metadata: 'class' must be one of");
  Meta no_dim = meta;
  no_dim.erase("dim");
  fails_with(good, no_dim, "'dim' is required for class ResidualVQ");
  fails_with(good, with("channel_last", "true"), "unknown key 'channel_last'");
  auto without = [&](const std::string& name) {
    NamedTensors t;
    for (auto& [n, v] : good)
      if (n != name) t.emplace_back(n, v);
    return t;
  };
  fails_with(without("layers.1._codebook.embed_avg"), meta, "missing tensor 'layers.1._codebook.embed_avg'");
  NamedTensors flat = without("layers.0._codebook.embed");
  flat.emplace_back("layers.0._codebook.embed", zeros({16, 8}));
  fails_with(flat, meta, "'layers.0._codebook.embed' must be float32 [1, 16, 8]");
  NamedTensors differs = without("layers.1._codebook.embed");
  differs.emplace_back("layers.1._codebook.embed", zeros({1, 16, 8}));
  fails_with(differs, meta, "'layers.1._codebook.embed' differs from the other copies of shared codebook.embed");
  NamedTensors extra = good;
  extra.emplace_back("layers.0.mask", zeros({3}, DType::i64));  // a constant of LFQ, not of ResidualVQ
  fails_with(extra, meta, "unexpected tensor 'layers.0.mask'");
  NamedTensors bad_g = without("g.1");
  bad_g.emplace_back("g.1", zeros({kRows, 3}));
  fails_with(bad_g, meta, "'g.1' must be float32 [24, 8] like 'x.1'");
}
