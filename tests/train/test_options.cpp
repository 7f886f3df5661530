// One option reader: config files, command-line overrides and replay
// metadata go through the same parsing and checks with the same key names
// (vq/quantizer_options.h, train/config.h).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "engine/core/file_io.h"
#include "engine/core/error.h"
#include "engine/core/json_strict.h"
#include "engine/core/safetensors.h"
#include "engine/core/tensor.h"
#include "tests/engine/tmpdir.h"
#include "tests/train/small_run.h"
#include "tool/replay.h"
#include "train/config.h"
#include "train/schedule.h"
#include "vq/quantizer_kind.h"
#include "vq/quantizer_options.h"
#include "vq/residual_lfq.h"
#include "vq/residual_vq.h"
#include "vq/vector_quantize.h"

using namespace vqddp;
using namespace vqddp::test;

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

namespace {

std::string config_error(const nlohmann::json& j) {
  try {
    parse_config(j, "c.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// stdout sent to a pipe, block-buffered as on a file or a pipe whatever the
// test's own stdout is; available() is what has reached the pipe so far.
// The runs it watches print a few KiB, far below a pipe's 64 KiB.
class StdoutPipe {
 public:
  StdoutPipe() {
    std::fflush(stdout);
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    read_ = fds[0];
    saved_ = ::dup(1);
    ::dup2(fds[1], 1);
    ::close(fds[1]);
    ::fcntl(read_, F_SETFL, O_NONBLOCK);
    std::setvbuf(stdout, nullptr, _IOFBF, 1 << 16);
  }
  ~StdoutPipe() {
    std::fflush(stdout);
    ::dup2(saved_, 1);
    ::close(saved_);
    ::close(read_);
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
  }
  std::string available() {
    char buf[4096];
    for (ssize_t n; (n = ::read(read_, buf, sizeof buf)) > 0;) text_.append(buf, static_cast<size_t>(n));
    return text_;
  }

 private:
  int read_ = -1, saved_ = -1;
  std::string text_;
};

}  // namespace

TEST_CASE("a malformed config names the file, the line and the column in our words") {
  TempDir dir;
  std::ofstream(dir.file("bad.json")) << "{\n  \"model\": {\"type\": \"mlp\"}\n  \"data\": {}\n}\n";
  std::string what;
  try {
    load_config(dir.file("bad.json"));
  } catch (const Error& e) {
    what = e.what();
  }
  // Reading stops at the end of "data", the string after the missing comma.
  CHECK(what.find(dir.file("bad.json") + ": not valid JSON at line 3, column 8: unexpected string literal; "
                                         "expected '}'") != std::string::npos);
  CHECK(what.find("json.exception") == std::string::npos);
  CHECK_THROWS_WITH_AS(parse_config_text("{\"run\": tru}", "t.json"),
                       doctest::Contains("t.json: not valid JSON at column 12: invalid literal"), Error);
  // A repeated key keeps its own message, by line.
  CHECK_THROWS_WITH_AS(parse_config_text("{\"run\": {},\n\"run\": {}}", "t.json"),
                       doctest::Contains("t.json: line 2: key \"run\" appears twice"), Error);
}

TEST_CASE("optimizer values out of range are refused by key, for the codec's optimizer and the discriminators'") {
  const nlohmann::json base = {{"data", {{"sources", {{{"path", "x"}}}}}}};
  const std::vector<std::pair<nlohmann::json, std::string>> refused = {
      {{{"beta1", 5}}, "'optimizer.beta1' must be in [0, 1), got 5"},
      {{{"beta1", 1}}, "'optimizer.beta1' must be in [0, 1), got 1"},
      {{{"beta2", -3}}, "'optimizer.beta2' must be in [0, 1), got -3"},
      {{{"eps", 0}}, "'optimizer.eps' must be positive"},
      {{{"weight_decay", -0.1}}, "'optimizer.weight_decay' must be >= 0"},
      {{{"momentum", 1.5}}, "'optimizer.momentum' must be in [0, 1)"},
      {{{"grad_clip", -1}}, "'optimizer.grad_clip' must be >= 0 (0: no clipping), got -1"}};
  for (const auto& [keys, message] : refused) {
    CAPTURE(keys.dump());
    nlohmann::json j = base;
    j["optimizer"] = keys;
    CHECK(config_error(j).find("c.json: " + message) != std::string::npos);
  }
  nlohmann::json ok = base;
  ok["optimizer"] = {{"beta1", 0}, {"beta2", 0.99}, {"grad_clip", 0}, {"momentum", 0.9}};
  CHECK(config_error(ok) == "");
  nlohmann::json gan = load_config_json(source_dir() + "/examples/speech_codec_gan.json");
  gan["gan"]["optimizer"]["grad_clip"] = -1;
  CHECK(config_error(gan).find("'gan.optimizer.grad_clip' must be >= 0") != std::string::npos);
}

TEST_CASE("conv model sizes no tensor could hold are refused by key before anything is allocated") {
  nlohmann::json codec = load_config_json(source_dir() + "/examples/speech_codec.json");
  codec["model"]["channels"] = {65536, 65536, 8, 8};
  codec["model"]["strides"] = {2, 4, 5};
  CHECK(config_error(codec).find("c.json: 'model.channels' gives channels[0]^2 x 3 = ") != std::string::npos);
  codec["model"]["latent_dim"] = 65536;
  codec["model"]["channels"] = {8, 8, 8, 65536};
  CHECK(config_error(codec).find("'model.latent_dim' gives channels[-1] x latent_dim x 7") != std::string::npos);
  nlohmann::json vqvae = load_config_json(source_dir() + "/examples/fashion_conv_vqvae.json");
  vqvae["model"]["channels"] = {65536, 65536};
  CHECK(config_error(vqvae).find("'model.channels' gives channels[0] x channels[1] x 4 x 4") != std::string::npos);
}

TEST_CASE("train's progress lines reach a pipe as they are printed, and a CPU run says why step graphs are off") {
  TempDir dir;
  Config cfg = small_config(dir.file("run"));
  cfg.distributed.world_size = 1;
  cfg.schedule.log_every = 1;
  cfg.schedule.steps = 5;
  cfg.run.step_graphs = true;  // --step-graphs on (the reader's fields for it: below)
  cfg.run.step_graphs_given = true;
  std::string before_step_4, all;
  {
    StdoutPipe out;  // doctest reports on stdout too: the checks come after it
    TrainOptions opt;
    opt.after_step = [&](const StepView& v) {
      if (v.step == 4) before_step_4 = out.available();
    };
    train(cfg, synthetic_data(), opt);
    all = out.available();
  }
  // Steps 1 to 3 were logged before step 4 ended; block-buffered, they would
  // still sit in the buffer.
  CHECK(before_step_4.find("step      3/5") != std::string::npos);
  CHECK(all.find("train: step graphs off: the CPU issues no launches") != std::string::npos);
  // Left to its default, a CPU run does not mention graphs it never has.
  cfg.run.step_graphs_given = false;
  cfg.run.dir = dir.file("run2");
  {
    StdoutPipe out;
    train(cfg, synthetic_data(), TrainOptions{});
    all = out.available();
  }
  CHECK(all.find("step      5/5") != std::string::npos);
  CHECK(all.find("step graphs") == std::string::npos);
  // The reader says whether the key was given: in the file, or by --step-graphs,
  // which the command line writes into the JSON it reads (tool/cli.cpp).
  nlohmann::json j = load_config_json(source_dir() + "/examples/speech_codec.json");
  CHECK_FALSE(parse_config(j, "c.json").run.step_graphs_given);
  j["run"]["step_graphs"] = true;
  CHECK(parse_config(j, "c.json").run.step_graphs_given);
  // A NUL in any string of a config is refused by key, never cut at.
  j["run"]["dir"] = std::string("runs/a\0b", 8);
  CHECK_THROWS_WITH_AS(parse_config(j, "c.json"), doctest::Contains("c.json: 'run.dir' holds a NUL character"), Error);
}

TEST_CASE("a resume refuses a metrics.jsonl that is a symbolic link, naming it, and copies nothing through it") {
  TempDir dir;
  Config cfg = small_config(dir.file("run"));
  cfg.schedule.steps = 4;
  TrainOptions first = quiet();
  first.print = true;  // the metrics file is written by a printing run
  first.stop_at_step = 2;
  {
    StdoutPipe quiet_here;
    train(cfg, synthetic_data(), first);
  }
  const std::string metrics = cfg.run.dir + "/metrics.jsonl";
  std::ofstream(dir.file("elsewhere.jsonl")) << "{\"step\": 1, \"secret\": 1}\n{\"step\": 99}\n";
  std::filesystem::remove(metrics);
  std::filesystem::create_symlink(dir.file("elsewhere.jsonl"), metrics);
  TrainOptions second = first;
  second.stop_at_step = 0;
  second.resume = cfg.run.dir + "/checkpoint.safetensors";
  std::string error;
  try {
    StdoutPipe quiet_here;
    train(cfg, synthetic_data(), second);
  } catch (const Error& e) {
    error = e.what();
  }
  CHECK(error.find(metrics + ": cannot open the metrics file for writing: it is a symbolic link") != std::string::npos);
  CHECK(std::filesystem::is_symlink(metrics));
  // A hard link to a file outside the run: refused too, nothing appended to it.
  std::filesystem::remove(metrics);
  std::ofstream(dir.file("outside.jsonl")) << "{\"step\": 1}\n";
  std::filesystem::create_hard_link(dir.file("outside.jsonl"), metrics);
  error.clear();
  try {
    StdoutPipe quiet_here;
    train(cfg, synthetic_data(), second);
  } catch (const Error& e) {
    error = e.what();
  }
  CHECK(error.find(metrics + ": the metrics file is not a regular file of the run's own (it has 2 hard links)") !=
        std::string::npos);
  CHECK(read_file(dir.file("outside.jsonl")) == "{\"step\": 1}\n");
}
