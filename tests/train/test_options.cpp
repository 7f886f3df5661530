// One option reader: config files, command-line overrides and replay
// metadata go through the same parsing and checks with the same key names
// (vq/quantizer_options.h, train/config.h).
#include <doctest/doctest.h>

#include <filesystem>

#include "engine/core/error.h"
#include "engine/core/json_strict.h"
#include "engine/core/safetensors.h"
#include "engine/core/tensor.h"
#include "tests/engine/tmpdir.h"
#include "tool/replay.h"
#include "train/config.h"
#include "train/schedule.h"
#include "vq/quantizer_kind.h"
#include "vq/quantizer_options.h"
#include "vq/residual_lfq.h"
#include "vq/residual_vq.h"
#include "vq/vector_quantize.h"

using namespace vqddp;

namespace {

std::string source_dir() {
  const char* src = std::getenv("VQDDP_SOURCE_DIR");
  return src ? src : ".";
}

std::vector<std::string> shipped_configs() {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(source_dir() + "/examples"))
    if (e.path().extension() == ".json") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

// Every codebook key, each away from its default.
const nlohmann::json kCodebookKeys = {{"decay", 0.5},          {"eps", 1e-4},         {"threshold_ema_dead_code", 1.5},
                                      {"kmeans_init", true},    {"kmeans_iters", 3},   {"use_cosine_sim", true},
                                      {"cluster_size_init", "zeros"}, {"sync_codebook", false}};

}  // namespace

TEST_CASE("every shipped config round-trips through the one reader: the JSON it keeps reads back to the same config") {
  std::vector<std::string> files = shipped_configs();
  REQUIRE(files.size() >= 5);  // speech_codec, fashion_vq, fashion_fsq, the LFQ examples
  std::set<std::string> types;
  for (const std::string& f : files) {
    CAPTURE(f);
    Config a = load_config(f);
    Config b = parse_config_text(a.source.dump(2), "round trip");
    CHECK(a == b);
    types.insert(a.quantizer.type());
    // An override reads as if the file held it; nothing else changes.
    Config c = parse_config(load_config_json(f), f, {{"--steps", "schedule.steps", 7}, {"--device", "run.device", "sim"}});
    Config want = a;
    want.schedule.steps = 7;
    want.run.device = "sim";
    CHECK(c == want);  // the source stays the file's: checkpoints store no command line
  }
  for (const QuantizerKind* k : quantizer_kinds()) {
    CAPTURE(k->type);
    // Every type a model can train has a shipped example.
    CHECK(types.count(k->type) == (k->trains_encoder ? 1u : 0u));
  }
}

TEST_CASE("a command-line override with a bad value is refused by the reader, naming the flag, the key and the choices") {
  std::string f = source_dir() + "/examples/fashion_vq.json";
  nlohmann::json j = load_config_json(f);
  CHECK_THROWS_WITH_AS(parse_config(j, f, {{"--backend", "distributed.backend", "gloo"}}),
                       doctest::Contains((f + " with --backend gloo: 'distributed.backend' must be one of \"single\", "
                                              "\"thread\", \"nccl\", \"mpi\", got \"gloo\"").c_str()),
                       Error);
  CHECK_THROWS_WITH_AS(parse_config(j, f, {{"--device", "run.device", "tpu"}}),
                       doctest::Contains("with --device tpu: 'run.device' must be one of \"cpu\", \"cuda\", \"sim\""),
                       Error);
  // The file's own value is checked the same way.
  j["distributed"]["backend"] = "gloo";
  CHECK_THROWS_WITH_AS(parse_config(j, f), doctest::Contains("'distributed.backend' must be one of"), Error);
}

TEST_CASE("replay and train accept the same codebook keys and read them to the same options") {
  nlohmann::json cfg = load_config_json(source_dir() + "/examples/fashion_vq.json");
  for (const auto& [k, v] : kCodebookKeys.items()) cfg["quantizer"][k] = v;
  Config c = parse_config(cfg, "config");

  test::TempDir dir;
  std::map<std::string, std::string> meta;
  for (const auto& [k, v] : kCodebookKeys.items()) meta[k] = v.is_string() ? v.get<std::string>() : v.dump();
  meta["commitment_weight"] = "0.25";
  std::string in = dir.file("in.safetensors");
  safetensors_save(in, {{"embed", ones({4, 2})}, {"embed_avg", ones({4, 2})}, {"cluster_size", ones({4})},
                        {"x.0", ones({3, 2})}}, meta);
  SafetensorsFile f = safetensors_load(in);
  float weight = 0;
  CodebookOptions r = replay_codebook_options(f, in, weight);
  CHECK(weight == 0.25f);
  CHECK(r == *c.quantizer.codebook());
  CHECK(r.decay == 0.5f);  // away from the default: the keys were read, not defaulted
  CHECK(r.cosine);
  CHECK_FALSE(r.cluster_size_init_ones);

  // The same check refuses the same bad value in both.
  cfg["quantizer"]["eps"] = 0;
  CHECK_THROWS_WITH_AS(parse_config(cfg, "config"), doctest::Contains("config: 'quantizer.eps' must be positive"), Error);
  meta["eps"] = "0";
  safetensors_save(in, {{"embed", ones({4, 2})}, {"embed_avg", ones({4, 2})}, {"cluster_size", ones({4})},
                        {"x.0", ones({3, 2})}}, meta);
  CHECK_THROWS_WITH_AS(replay_codebook_options(safetensors_load(in), in, weight),
                       doctest::Contains((in + " metadata: 'eps' must be positive").c_str()), Error);
}

TEST_CASE("LFQ types: their keys are read for lfq and residual_lfq only, codebook_size must be a power of two") {
  nlohmann::json cfg = load_config_json(source_dir() + "/examples/fashion_vq.json");
  cfg["quantizer"] = {{"type", "residual_lfq"}, {"codebook_size", 64}, {"num_quantizers", 2},
                      {"entropy_loss_weight", 0.2}, {"diversity_gamma", 0.5}, {"commitment_loss_weight", 0.1}};
  Config c = parse_config(cfg, "config");
  const LFQOptions& lfq = c.quantizer.as<ResidualLFQOptions>().lfq;
  CHECK(lfq.entropy_loss_weight == 0.2f);
  CHECK(lfq.diversity_gamma == 0.5f);
  CHECK(lfq.commitment_weight == 0.1f);
  cfg["quantizer"]["codebook_size"] = 48;
  CHECK_THROWS_WITH_AS(parse_config(cfg, "config"),
                       doctest::Contains("config: 'quantizer.codebook_size' must be a power of two in [2, 65536] for "
                                         "type \"residual_lfq\", got 48"),
                       Error);
  cfg["quantizer"] = {{"type", "vq"}, {"entropy_loss_weight", 0.2}};
  CHECK_THROWS_WITH_AS(parse_config(cfg, "config"), doctest::Contains("unknown key 'quantizer.entropy_loss_weight'"),
                       Error);
  cfg["quantizer"] = {{"type", "lookup_free"}};
  CHECK_THROWS_WITH_AS(parse_config(cfg, "config"),
                       doctest::Contains("'quantizer.type' must be one of \"vq\", \"residual_vq\", \"fsq\", "
                                         "\"residual_fsq\", \"lfq\", \"residual_lfq\""),
                       Error);
}

TEST_CASE("quantizer section: each type reads only its own keys; another type's key is refused naming the type") {
  nlohmann::json cfg = load_config_json(source_dir() + "/examples/fashion_vq.json");
  struct Case {
    const char* type;
    nlohmann::json extra;  // a key this type does not use
  };
  const Case cases[] = {
      {"lfq", {{"commitment_weight", 0.5}}},          {"lfq", {{"decay", 0.9}}},
      {"lfq", {{"num_quantizers", 2}}},                {"residual_lfq", {{"kmeans_init", true}}},
      {"fsq", {{"decay", 0.9}}},                       {"fsq", {{"kmeans_iters", 5}}},
      {"fsq", {{"codebook_size", 256}}},               {"residual_fsq", {{"commitment_weight", 0.5}}},
      {"vq", {{"num_quantizers", 2}}},                 {"vq", {{"quantize_dropout", true}}},
      {"vq", {{"quantize_dropout_cutoff_index", 0}}},  {"vq", {{"shared_codebook", true}}},
      {"vq", {{"levels", {8, 5}}}},                    {"residual_vq", {{"diversity_gamma", 1.0}}},
      {"residual_fsq", {{"shared_codebook", true}}},   {"residual_lfq", {{"codebook_dim", 4}}},
      {"residual_vq", {{"heads", 2}}},                 {"residual_vq", {{"separate_codebook_per_head", true}}},
      {"fsq", {{"rotation_trick", false}}},            {"lfq", {{"rotation_trick", false}}},
      {"sim_vq", {{"decay", 0.9}}},                    {"sim_vq", {{"num_quantizers", 2}}},
      {"vq", {{"frozen_codebook_dim", 4}}},            {"residual_vq", {{"groups", 2}}},
      {"grouped_residual_vq", {{"heads", 2}}},         {"grouped_residual_fsq", {{"decay", 0.9}}},
      {"grouped_residual_lfq", {{"kmeans_init", true}}}, {"residual_vq", {{"layernorm_after_project_in", true}}},
  };
  for (const Case& c : cases) {
    nlohmann::json q = {{"type", c.type}};
    if (std::string(c.type).ends_with("fsq")) q["levels"] = {8, 5, 5, 5};
    if (std::string(c.type).ends_with("lfq")) q["codebook_size"] = 64;
    const std::string key = c.extra.begin().key();
    q[key] = c.extra.begin().value();
    cfg["quantizer"] = q;
    CAPTURE(c.type);
    CAPTURE(key);
    CHECK_THROWS_WITH_AS(parse_config(cfg, "config"),
                         doctest::Contains(fmt::format("config: unknown key 'quantizer.{}' for type \"{}\"", key, c.type).c_str()),
                         Error);
    q.erase(key);
    cfg["quantizer"] = q;
    CHECK_NOTHROW(parse_config(cfg, "config"));
  }
  // Every shipped example uses only its type's keys.
  for (const auto& e : std::filesystem::directory_iterator(source_dir() + "/examples")) {
    if (e.path().extension() != ".json") continue;
    CAPTURE(e.path().string());
    CHECK_NOTHROW(parse_config(load_config_json(e.path().string()), e.path().string()));
  }
}

TEST_CASE("quantizer.heads, separate_codebook_per_head and rotation_trick reach the VectorQuantize the factory makes") {
  nlohmann::json cfg = load_config_json(source_dir() + "/examples/fashion_vq.json");
  cfg["quantizer"] = {{"type", "vq"}, {"heads", 2}, {"separate_codebook_per_head", true}, {"rotation_trick", false}};
  QuantizerOptions q = parse_config(cfg, "config").quantizer;
  Generator init(0, 0);
  auto vq = std::dynamic_pointer_cast<VectorQuantize>(make_quantizer(q, 8, 1, init));
  REQUIRE(vq);
  CHECK(vq->options().heads == 2);
  CHECK(vq->codebooks().size() == 2);
  CHECK_FALSE(vq->options().rotation_trick);
  CHECK(vq->layer_sizes().size() == 2);
  // Heads must divide the model's latent width unless codebook_dim is set.
  const int64_t latent = cfg["model"]["latent_dim"].get<int64_t>();
  cfg["quantizer"] = {{"type", "vq"}, {"heads", latent + 1}};
  CHECK_THROWS_WITH_AS(parse_config(cfg, "config"),
                       doctest::Contains(fmt::format("'quantizer.heads' must divide the input width ({}; model.latent_dim in a "
                                                     "config)", latent).c_str()),
                       Error);
  cfg["quantizer"]["codebook_dim"] = 3;
  CHECK_NOTHROW(parse_config(cfg, "config"));
  // The defaults are vector-quantize-pytorch's.
  cfg["quantizer"] = {{"type", "residual_vq"}};
  CHECK(parse_config(cfg, "config").quantizer.as<ResidualVQOptions>().rotation_trick);
}

TEST_CASE("optimizer.lr_schedule: constant keeps lr; cosine runs from lr at the first step to final_lr_fraction lr at the last") {
  OptimizerConfig o;
  o.lr = 0.002f;
  CHECK(learning_rate(o, 0, 100) == 0.002f);
  CHECK(learning_rate(o, 99, 100) == 0.002f);
  o.lr_schedule = "cosine";
  o.final_lr_fraction = 0.1;
  CHECK(learning_rate(o, 0, 100) == 0.002f);
  CHECK(learning_rate(o, 99, 100) == doctest::Approx(0.0002));
  CHECK(learning_rate(o, 50, 101) == doctest::Approx(0.0011));  // halfway: (1 + 0.1) / 2
  for (int64_t s = 1; s < 100; ++s) CHECK(learning_rate(o, s, 100) < learning_rate(o, s - 1, 100));
  nlohmann::json j = {{"optimizer", {{"lr_schedule", "linear"}}}, {"data", {{"sources", {{{"path", "x"}}}}}}};
  CHECK_THROWS_WITH(parse_config(j, "c.json"), doctest::Contains("optimizer.lr_schedule"));
  j["optimizer"] = {{"lr_schedule", "cosine"}, {"final_lr_fraction", 1.5}};
  CHECK_THROWS_WITH(parse_config(j, "c.json"), doctest::Contains("optimizer.final_lr_fraction"));
}
