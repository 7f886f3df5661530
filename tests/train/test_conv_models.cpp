// The convolutional model types (model.type conv_codec and conv_vqvae,
// train/networks.h): they learn, their ranks agree (check-ddp), their
// tokens and bitrate follow the strides, and bad sizes are refused by key.
#include <doctest/doctest.h>

#include <cmath>

#include "comm/single.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "tests/engine/causality.h"
#include "tests/train/small_run.h"
#include "tool/check_ddp.h"
#include "train/model.h"
#include "train/networks.h"

using namespace vqddp;
using namespace vqddp::test;

namespace {

// Waveform segments of `f` samples: two sinusoids of random frequency and
// phase each (learnable structure, unlike white noise), plus a little noise.
Dataset tones(int64_t f, int64_t rows, int64_t validation, uint64_t seed) {
  Generator g(seed, 0);
  auto make = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n * f));
    for (int64_t i = 0; i < n; ++i) {
      float f1 = 0.05f + 0.3f * g.uniform(), f2 = 0.05f + 0.3f * g.uniform(), p = 6.28f * g.uniform();
      for (int64_t t = 0; t < f; ++t)
        v[i * f + t] = 0.3f * std::sin(f1 * t + p) + 0.2f * std::sin(f2 * t) + 0.01f * (g.uniform() - 0.5f);
    }
    return from_vector(v, {n, f});
  };
  Dataset d;
  d.sources = {make(rows)};
  d.weights = {1.0};
  d.validation = make(validation);
  d.example_dim = f;
  d.examples_per_second = 8000.0 / f;  // audio: the validation computes the log-mel distance too
  d.sample_rate = 8000;                // and the model builds its STOI loss
  d.description = "tones";
  return d;
}

// Images of 8 x 8: a bright square at a random place.
Dataset squares(int64_t rows, int64_t validation, uint64_t seed) {
  Generator g(seed, 0);
  auto make = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n * 64), 0.f);
    for (int64_t i = 0; i < n; ++i) {
      int64_t y0 = static_cast<int64_t>(g.uniform_int(5)), x0 = static_cast<int64_t>(g.uniform_int(5));
      for (int64_t y = y0; y < y0 + 3; ++y)
        for (int64_t x = x0; x < x0 + 3; ++x) v[i * 64 + y * 8 + x] = 1.f;
    }
    return from_vector(v, {n, 64});
  };
  Dataset d;
  d.sources = {make(rows)};
  d.weights = {1.0};
  d.validation = make(validation);
  d.example_dim = 64;
  d.description = "squares";
  return d;
}

Config conv_config(const std::string& type, const std::string& dir) {
  nlohmann::json model = type == "conv_codec"
                             ? nlohmann::json{{"type", "conv_codec"}, {"channels", {4, 8, 8}}, {"strides", {2, 4}},
                                              {"latent_dim", 4}, {"activation", "elu"}, {"spectral_weight", 0.1},
                                              {"stoi_weight", 0.1}}
                             : nlohmann::json{{"type", "conv_vqvae"}, {"channels", {4, 8}}, {"latent_dim", 4},
                                              {"activation", "leaky_relu"}, {"sigmoid_output", true}};
  nlohmann::json j = {
      {"model", model},
      {"quantizer", {{"type", "residual_vq"}, {"num_quantizers", 2}, {"codebook_size", 16}, {"decay", 0.9},
                     {"threshold_ema_dead_code", 1.0}, {"kmeans_iters", 3}}},
      {"data", {{"type", type == "conv_codec" ? "wav_frames" : "fashion_mnist"}, {"sources", {{{"path", "unused"}}}},
                {"frame", 256}}},
      {"optimizer", {{"lr", 0.005}}},
      {"schedule", {{"batch_size", 12}, {"epochs", 1}, {"log_every", 5}, {"validate_every", 0}}},
      {"distributed", {{"world_size", 3}, {"timeout_s", 20}}},
      {"run", {{"dir", dir}, {"seed", 5}}}};
  return parse_config(j, "test");
}

std::string tmp(const std::string& name) {
  const char* base = std::getenv("VQDDP_TEST_TMP");
  return std::string(base ? base : "/tmp") + "/conv-models-" + name;
}

}  // namespace

TEST_CASE("conv_codec and conv_vqvae: the validation error falls over a short 3-rank training run") {
  for (const std::string type : {"conv_codec", "conv_vqvae"}) {
    CAPTURE(type);
    Config cfg = conv_config(type, tmp(type));
    Dataset data = type == "conv_codec" ? tones(256, 240, 24, 1) : squares(240, 24, 2);
    cfg.schedule.steps = 1;
    TrainOptions opt = quiet();
    opt.overwrite = true;  // two runs into one directory, kept between test runs
    TrainResult first = train(cfg, data, opt);
    cfg.schedule.steps = type == "conv_codec" ? 60 : 200;
    TrainResult last = train(cfg, data, opt);
    CHECK(last.validation_mse < 0.5 * first.validation_mse);
    CHECK(last.validation_snr_db > first.validation_snr_db + 3);
    if (type == "conv_codec") {
      CHECK(first.validation_log_mel > 0);
      CHECK(last.validation_log_mel < first.validation_log_mel);
    } else {
      CHECK(last.validation_log_mel == -1);  // images: no log-mel distance
    }
  }
}

TEST_CASE("conv_codec: one token per product-of-strides samples, bitrate and latent layout follow") {
  Config cfg = conv_config("conv_codec", tmp("layout"));
  CodecModel model(cfg.model, cfg.quantizer, 256, 1, 8000);
  // 256 samples / (2 * 4) = 32 tokens of 2 x 4 bits.
  CHECK(model.bits_per_example() == 32 * 8);
  SingleCommunicator comm;
  Generator init(2, 0);
  model.forward(rand_normal({4, 256}, init), comm);  // a training-mode pass runs the k-means init
  NoGradGuard no_grad;
  model.eval();
  Generator g(1, 0);
  ModelOutput out = model.forward(rand_normal({3, 256}, g), comm);
  CHECK(out.indices.shape() == Shape{3 * 32, 2});
  CHECK(out.reconstruction.shape() == Shape{3, 256});
  // A sample's tokens do not depend on the rest of the batch (the conv
  // forward is batch-invariant), so sample 1 alone gives rows 32..63.
  Generator h(1, 0);
  Tensor x = rand_normal({3, 256}, h);
  ModelOutput one = model.forward(slice_rows(x, 1, 2).clone(), comm);
  std::vector<int64_t> all = out.indices.to_vector<int64_t>(), mine = one.indices.to_vector<int64_t>();
  CHECK(std::vector<int64_t>(all.begin() + 64, all.begin() + 128) == mine);
}

TEST_CASE("conv_codec with model.causal: a latent frame waits for its own samples and no later one, a decoded "
          "sample for its own frame and no later one") {
  Config cfg = conv_config("conv_codec", tmp("causal"));
  cfg.model.residual_units = 2;  // dilations 1 and 3
  const int64_t hop = 8, f = 256;
  NoGradGuard no_grad;
  for (bool causal : {true, false}) {
    CAPTURE(causal);
    cfg.model.causal = causal;
    Generator gen(1, 0), data(2, 0);
    Network net = make_network(cfg.model, f, gen);
    Tensor x = rand_normal({2, 1, f}, data);
    Tensor z = net.encoder->forward(x);
    REQUIRE(z.shape() == Shape{2, 4, f / hop});
    // Samples from p on changed: the frames before p / hop keep their bits
    // (causal), frame p / hop changes (p is among its samples).
    for (int64_t p : {int64_t{100}, int64_t{103}, int64_t{104}, f - 1}) {
      CAPTURE(p);
      auto [same, differs] = test::same_before(z, net.encoder->forward(test::future_changed(x, p)), p / hop);
      CHECK(same == causal);  // the symmetric codec looks ahead: its earlier frames change too
      CHECK(differs);
    }
    Tensor y = net.decoder->forward(z);
    REQUIRE(y.shape() == Shape{2, 1, f});
    for (int64_t t : {int64_t{1}, int64_t{16}, f / hop - 1}) {
      CAPTURE(t);
      auto [same, differs] = test::same_before(y, net.decoder->forward(test::future_changed(z, t)), t * hop);
      CHECK(same == causal);
      CHECK(differs);
    }
  }
  // The key is conv_codec's: read from a config, unknown to the other types.
  nlohmann::json j = {{"model", {{"type", "conv_codec"}, {"causal", true}}}, {"data", {{"sources", {{{"path", "x"}}}}}}};
  CHECK(parse_config(j, "c.json").model.causal);
  j["model"] = {{"type", "conv_vqvae"}, {"causal", true}};
  CHECK_THROWS_WITH(parse_config(j, "c.json"), doctest::Contains("unknown key 'model.causal'"));
}

TEST_CASE("conv model sizes that do not fit are refused naming the key") {
  Config cfg = conv_config("conv_codec", tmp("bad"));
  CHECK_THROWS_WITH(CodecModel(cfg.model, cfg.quantizer, 250, 1),
                    doctest::Contains("data.frame 250 must be a multiple of the product of model.strides (8)"));
  Config img = conv_config("conv_vqvae", tmp("bad"));
  CHECK_THROWS_WITH(CodecModel(img.model, img.quantizer, 60, 1), doctest::Contains("square images with a side divisible by 4"));
  nlohmann::json j = {{"model", {{"type", "conv_codec"}, {"channels", {4, 8}}, {"strides", {2, 4}}}},
                      {"data", {{"sources", {{{"path", "x"}}}}}}};
  CHECK_THROWS_WITH(parse_config(j, "c.json"), doctest::Contains("model.channels"));
  j["model"] = {{"type", "conv_codec"}, {"channels", {4, 4, 4, 4, 4, 4}}, {"strides", {64, 64, 64, 64, 64}}};
  CHECK_THROWS_WITH(parse_config(j, "c.json"), doctest::Contains("'model.strides' must be positive with a product"));
  j["model"] = {{"type", "conv_codec"}, {"spectral_weight", -1}};
  CHECK_THROWS_WITH(parse_config(j, "c.json"), doctest::Contains("model.spectral_weight"));
  // Each type reads only its own keys: another type's key is unknown, never ignored.
  j["model"] = {{"type", "mlp"}, {"strides", {2}}};
  CHECK_THROWS_WITH(parse_config(j, "c.json"), doctest::Contains("unknown key 'model.strides'"));
  j["model"] = {{"type", "conv_codec"}, {"stoi_weight", -0.5}};
  CHECK_THROWS_WITH(parse_config(j, "c.json"), doctest::Contains("model.stoi_weight"));
  j["model"] = {{"type", "conv_vqvae"}, {"spectral_weight", 1}};
  CHECK_THROWS_WITH(parse_config(j, "c.json"), doctest::Contains("unknown key 'model.spectral_weight'"));
  j["model"] = {{"type", "conv_codec"}, {"hidden", 256}};
  CHECK_THROWS_WITH(parse_config(j, "c.json"), doctest::Contains("unknown key 'model.hidden'"));
  // The same rule for a ModelConfig built in code (no reader in between).
  ModelConfig bare;
  bare.type = "conv_codec";
  Generator gen(1, 0);
  CHECK_THROWS_WITH(make_network(bare, 256, gen), doctest::Contains("model.channels needs one entry more than strides"));
  // Strides the reader's ranges never let through: not positive, or a
  // product that overflows int64.
  bare.channels = {4, 4, 4};
  for (std::vector<int64_t> strides : {std::vector<int64_t>{2, 0}, {int64_t{1} << 40, int64_t{1} << 40}}) {
    bare.strides = strides;
    CHECK_THROWS_WITH(make_network(bare, 256, gen), doctest::Contains("model.strides must be positive with a product"));
  }
  // A spectral loss on a model that is not an audio codec, built in code.
  ModelConfig image;
  image.type = "mlp";
  image.spectral_weight = 0.5;
  CHECK_THROWS_WITH(make_network(image, 784, gen),
                    doctest::Contains("model.spectral_weight applies to conv_codec only (an STFT loss on audio), not mlp"));
}

TEST_CASE("check-ddp passes on both conv model types: every checkpoint tensor bit for bit over a whole run") {
  for (const std::string type : {"conv_codec", "conv_vqvae"}) {
    CAPTURE(type);
    Config cfg = conv_config(type, tmp("ddp-" + type));
    Dataset data = type == "conv_codec" ? tones(256, 120, 12, 3) : squares(120, 12, 4);
    // Batch 12 on 2 and 4 ranks, and 3 on 4 ranks: one rank with no rows
    // runs every conv, the quantizer and the losses on N = 0.
    for (auto [world, batch] : {std::pair{2, 12}, std::pair{4, 12}, std::pair{4, 3}}) {
      CAPTURE(world);
      CAPTURE(batch);
      cfg.schedule.batch_size = batch;
      // A whole run: every checkpoint tensor bit for bit after every step.
      CheckDdpResult r = check_ddp(cfg, data, {.world = world, .steps = 3, .print = false});
      CHECK_MESSAGE(r.passed, r.first_failure);
      CHECK(r.tensors > 0);
    }
  }
}

TEST_CASE("conv_codec: a whole run on the CPU ends in the bits of the same run on sim, on 1 rank and on 3") {
  // One op path on every device (conv_columnless's three kernels); the
  // CPU's kernel table computes stride-1 1-D plans without im2col
  // (engine/cpu/fixed_gemm.h, each kernel tested against the column path's
  // chains in test_fixed_gemm.cpp; the main job's checkpoint is pinned by
  // test_golden.cpp). The same checkpoint after a whole run, on 1 rank and
  // on 3 (where every rank's units are partials).
  Dataset data = tones(256, 120, 12, 3);
  for (int world : {1, 3}) {
    CAPTURE(world);
    Config cpu = conv_config("conv_codec", tmp("direct-cpu"));
    cpu.distributed.world_size = world;
    Config sim = conv_config("conv_codec", tmp("direct-sim"));
    sim.distributed.world_size = world;
    sim.run.device = "sim";
    TrainOptions opt = quiet();
    opt.overwrite = true;
    train(cpu, data, opt);
    train(sim, data, opt);
    NamedTensors c = safetensors_load(cpu.run.dir + "/checkpoint.safetensors").tensors,
                 s = safetensors_load(sim.run.dir + "/checkpoint.safetensors").tensors;
    REQUIRE(!c.empty());
    CHECK(first_difference(s, c) == "");
  }
}
