// Adversarial codec training (train/gan.h) under exact data parallelism:
// whole GAN runs on W thread ranks, any split, are bit for bit the 1-rank
// run in every tensor of both models and both optimizers; an elastic resume
// ends in the uninterrupted run's bytes; the discriminators update on the
// steps the seed picks, on every rank alike, whatever one rank's data holds;
// check-ddp compares both models.
#include <doctest/doctest.h>

#include <fstream>
#include <mutex>

#include "engine/ops.h"
#include "tests/engine/tmpdir.h"
#include "tests/train/small_run.h"
#include "tool/check_ddp.h"
#include "tool/report.h"
#include "train/checkpoint.h"
#include "train/gan.h"
#include "train/model.h"

using namespace vqddp;
using namespace vqddp::test;

namespace gan_test {

// A small conv codec on 64-sample frames with both kinds of discriminator,
// a warm-up, and updates on a seeded half of the later steps; the schedule
// logs and validates mid-run, so those collectives run too.
Config gan_config(const std::string& dir, int64_t steps, const std::string& loss = "hinge") {
  nlohmann::json j = {
      {"model",
       {{"type", "conv_codec"}, {"channels", {4, 8, 8}}, {"strides", {2, 4}}, {"latent_dim", 4}}},
      {"quantizer",
       {{"type", "residual_vq"}, {"num_quantizers", 2}, {"codebook_size", 16}, {"decay", 0.9},
        {"threshold_ema_dead_code", 1.0}, {"kmeans_iters", 3}}},
      {"data", {{"type", "wav_frames"}, {"sources", {{{"path", "unused"}}}}}},
      {"optimizer", {{"lr", 0.003}, {"lr_schedule", "cosine"}, {"grad_clip", 0.05}}},
      {"gan",
       {{"periods", {2, 3}}, {"period_channels", {4, 4}}, {"stft_windows", {32, 16}}, {"stft_filters", 4},
        {"loss", loss}, {"warmup_steps", 2}, {"update_probability", 0.5},
        {"optimizer", {{"lr", 0.002}, {"beta1", 0.5}, {"grad_clip", 0.05}}}}},
      {"schedule", {{"batch_size", 12}, {"steps", steps}, {"log_every", 3}, {"validate_every", 4}}},
      {"distributed", {{"world_size", 3}, {"timeout_s", 5}}},
      {"run", {{"dir", dir}, {"seed", 11}}}};
  return parse_config(j, "test");
}

Dataset gan_data() {
  Dataset d = synthetic_data(64);
  d.sample_rate = 8000;
  d.examples_per_second = 8000.0 / 64;
  return d;
}

// gan_data with 24 s held out: three validation chunks of 2^16 values
// (train/validation.cpp), each long enough for STOI, spread over the ranks. Only
// the W-ranks test scores it: its STOI costs each validation about a second
// of ThreadSanitizer time, too much for every GAN test.
Dataset gan_data_scored() {
  Dataset d = gan_data();
  Generator g(5, 0);
  d.validation = rand_normal({3000, 64}, g);
  return d;
}

struct Ended {
  NamedTensors tensors;             // rank 0's checkpoint tensors after the last step
  std::vector<int64_t> updates;     // rank 0's steps that changed the discriminators
  TrainResult result;
};

// Every rank's checkpoint tensors (codec, discriminators, both optimizers)
// after the last step must be rank 0's; every rank must see the
// discriminators change on the same steps.
Ended run(const Config& cfg, const Dataset& data, int world, std::vector<int64_t> units, TrainOptions opt = {}) {
  Config c = cfg;
  c.distributed.world_size = world;
  c.run.dir += fmt::format("/w{}-{}", world, fmt::join(units, "-"));
  opt.print = false;
  opt.overwrite = true;
  opt.checkpoints = !opt.resume.empty() || opt.stop_at_step > 0;
  opt.rank_units = std::move(units);
  const int64_t last = opt.stop_at_step > 0 ? opt.stop_at_step : cfg.schedule.steps;
  std::vector<NamedTensors> ranks(world), before(world);
  std::vector<std::vector<int64_t>> updates(world);
  std::mutex mu;
  opt.after_step = [&](const StepView& v) {
    const int64_t step = v.step;
    const int rank = v.rank;
    REQUIRE(v.parts.size() == 2);  // the codec, then the discriminators
    NamedTensors now = copies_on(v.parts[1].module.named_parameters(), Device::cpu());
    std::lock_guard lock(mu);
    if (!before[rank].empty() && !bitwise_equal(now, before[rank])) updates[rank].push_back(step);
    before[rank] = std::move(now);
    if (step == last) ranks[rank] = copies_on(checkpoint_tensors(v.parts), Device::cpu());
  };
  Ended e;
  e.result = train(c, data, opt);
  for (int q = 1; q < world; ++q) {
    CHECK_MESSAGE(bitwise_equal(ranks[q], ranks[0]), "rank " << q);
    CHECK_MESSAGE(updates[q] == updates[0], "rank " << q);
  }
  e.tensors = ranks[0];
  e.updates = updates[0];
  return e;
}


TEST_CASE("a whole GAN run on W = 3, 4 and 7 thread ranks, and on uneven splits with an empty rank, is bit for bit "
          "the 1-rank run: codec, discriminators and both optimizers") {
  TempDir dir;
  Dataset data = gan_data_scored();
  Config cfg = gan_config(dir.path().string(), sanitized_build() ? 6 : 10);
  // A sanitized rank scoring a chunk's STOI keeps the others waiting longer
  // than the usual 5 s.
  if (sanitized_build()) cfg.distributed.timeout_s = 60;
  Ended one = run(cfg, data, 1, {});
  size_t disc_tensors = 0;
  for (const auto& [name, t] : one.tensors) disc_tensors += name.starts_with("discriminator.");
  CHECK(disc_tensors > 20);  // both discriminators' weights, gains, biases and their AdamW moments
  // Updates: past the 2 warm-up steps, on the steps the seed picks, and only those.
  std::vector<int64_t> picked;
  for (int64_t s = 1; s <= cfg.schedule.steps; ++s)
    if (discriminator_updates(cfg.gan, cfg.run.seed, s)) picked.push_back(s);
  CHECK(one.updates == picked);
  CHECK(!picked.empty());
  CHECK(picked.size() < static_cast<size_t>(cfg.schedule.steps - 2));  // p = 0.5 skipped some
  CHECK(picked.front() > 2);
  // Sanitized builds (their suite's time): the uneven split only.
  std::vector<std::pair<int, std::vector<int64_t>>> splits{{3, {8, 0, 4}}};
  if (!sanitized_build()) splits.insert(splits.begin(), {{3, {}}, {4, {}}, {7, {}}});
  for (const auto& [world, units] : splits) {
    CAPTURE(world);
    CAPTURE(fmt::format("{}", fmt::join(units, ",")));
    Ended w = run(cfg, data, world, units);
    CHECK(first_difference(w.tensors, one.tensors) == "");
    CHECK(w.updates == one.updates);
    CHECK(w.result.validation_log_mel == one.result.validation_log_mel);
    CHECK(w.result.validation_stft_distance == one.result.validation_stft_distance);
    CHECK(w.result.validation_snr_db == one.result.validation_snr_db);
    CHECK(w.result.validation_stoi == one.result.validation_stoi);
  }
  CHECK(one.result.validation_stoi > 0);  // scored: the checks above compare figures
  CHECK(one.result.validation_stft_distance > 0);
}

TEST_CASE("a GAN run on sim (every device path, each step kind's graph) is the CPU run, on 1 rank and on 3 uneven "
          "thread ranks, both replaying step graphs") {
  TempDir dir;
  Dataset data = gan_data();
  Config cfg = gan_config(dir.path().string(), 10);
  NamedTensors cpu = run(cfg, data, 1, {}).tensors;
  cfg.run.device = "sim";
  if (!sanitized_build()) {
    Ended one = run(cfg, data, 1, {});
    CHECK(first_difference(one.tensors, cpu) == "");
    // A world of one replays step graphs: steps 1-2 issued (the warm-up),
    // every later step a replay but the first and second of each kind
    // (adversarial with or without a discriminator update): each kind is
    // issued once, captured, then replayed as its own graph.
    CHECK(one.result.graph_replays >= cfg.schedule.steps - 2 - 4);
  }
  // 3 thread ranks graph too (their collectives are launches of the step
  // on sim), one with no rows of its own.
  Ended three = run(cfg, data, 3, {2, 0, 10});
  CHECK(first_difference(three.tensors, cpu) == "");
  CHECK(three.result.graph_replays >= cfg.schedule.steps - 2 - 4);
}

TEST_CASE("a GAN run with least-squares losses is the 1-rank run on 3 uneven ranks") {
  TempDir dir;
  Dataset data = gan_data();
  Config cfg = gan_config(dir.path().string(), 6, "least_squares");
  if (sanitized_build()) return;  // the hinge cases run the same ops; the suite's time
  CHECK(first_difference(run(cfg, data, 3, {5, 7, 0}).tensors, run(cfg, data, 1, {}).tensors) == "");
}

TEST_CASE("elastic resume of a GAN run: stopped on 4 ranks, resumed on 3, it ends in the bytes of the "
          "uninterrupted run, discriminators and their optimizer included") {
  TempDir dir;
  Dataset data = gan_data();
  Config cfg = gan_config(dir.path().string(), 10);
  NamedTensors straight = run(cfg, data, 1, {}).tensors;
  Config c = cfg;
  c.run.dir = dir.path().string() + "/elastic";
  c.distributed.world_size = 4;
  TrainOptions stop;
  stop.print = false;
  stop.stop_at_step = 5;
  train(c, data, stop);
  const std::string ckpt = c.run.dir + "/checkpoint.safetensors";
  CHECK(safetensors_load(ckpt).contains("discriminator.param.period2.conv0.weight_v"));
  TrainOptions resume;
  resume.resume = ckpt;
  Ended resumed = run(c, data, 3, {}, resume);
  CHECK(first_difference(resumed.tensors, straight) == "");
}

TEST_CASE("a GAN checkpoint is the list of its parts: inference reads the codec's and passes over the "
          "discriminators', a codec-only list refuses them, a tensor of no part is refused either way") {
  TempDir dir;
  Dataset data = gan_data();
  Config cfg = gan_config(dir.path().string(), 3);
  cfg.distributed.world_size = 1;
  TrainOptions o;
  o.print = false;
  o.validate = false;
  train(cfg, data, o);
  const std::string ckpt = cfg.run.dir + "/checkpoint.safetensors";
  const SafetensorsFile f = read_checkpoint(ckpt);
  CodecModel model(cfg.model, cfg.quantizer, data.example_dim, cfg.run.seed, static_cast<double>(data.sample_rate));
  CHECK(load_model_weights(f, model) == 3);
  // The codec's weights are the checkpoint's.
  for (const auto& [name, p] : model.named_parameters())
    CHECK(first_difference({{name, p}}, {{name, f.at("param." + name)}}) == "");
  // A resume that knows the codec alone meets the discriminators' tensors.
  std::unique_ptr<Optimizer> optim = make_optimizer(cfg.optimizer, model.parameters());
  CHECK_THROWS_WITH_AS(load_checkpoint(ckpt, codec_part(model, *optim), 3),
                       doctest::Contains("the checkpoint has tensor 'discriminator."), Error);
  // A tensor that belongs to no part is refused by inference too.
  NamedTensors more = f.tensors;
  more.emplace_back("stray", zeros({1}));
  const std::string odd = dir.path().string() + "/odd.safetensors";
  safetensors_save(odd, more, f.metadata);
  CHECK_THROWS_WITH_AS(load_model_weights(read_checkpoint(odd), model),
                       doctest::Contains("the checkpoint has tensor 'stray', the model does not"), Error);
}

TEST_CASE("the discriminators update on the steps the seed picks on every rank alike when one rank's data is "
          "extreme: the same collectives on every rank, and the 1-rank run's bits") {
  // The first 8 rows of each source are loud (1e3 x a normal draw), the rest
  // silence; 12 units split 1 / 11: rank 0's one example is often loud while
  // rank 1's batch is mostly silent. A decision from local data (a
  // discriminator loss threshold) would split the ranks' collectives here;
  // the thread backend compares every collective's fingerprint across ranks.
  TempDir dir;
  Dataset data = gan_data();
  Generator g(5, 0);
  data.sources = {concat({mul(rand_normal({8, 64}, g), 1000.f), zeros({62, 64})}),
                  concat({mul(rand_normal({8, 64}, g), 1000.f), zeros({27, 64})})};
  Config cfg = gan_config(dir.path().string(), 10);
  Ended one = run(cfg, data, 1, {});
  Ended split = run(cfg, data, 2, {1, 11});
  CHECK(first_difference(split.tensors, one.tensors) == "");
  CHECK(split.updates == one.updates);
  std::vector<int64_t> picked;
  for (int64_t s = 1; s <= 10; ++s)
    if (discriminator_updates(cfg.gan, cfg.run.seed, s)) picked.push_back(s);
  CHECK(split.updates == picked);
}

TEST_CASE("check-ddp compares both models of a GAN run, and the per-step mode resumes both") {
  TempDir dir;
  Dataset data = gan_data();
  Config cfg = gan_config(dir.path().string(), 6);
  // Past the 2 warm-up steps, so the adversarial steps are compared too.
  CheckDdpResult whole = check_ddp(cfg, data, {.world = 3, .steps = 4, .print = false});
  CHECK_MESSAGE(whole.passed, whole.first_failure);
  Config plain = cfg;
  plain.gan = GanConfig{};
  CheckDdpResult codec_only = check_ddp(plain, data, {.world = 3, .steps = 1, .print = false});
  CHECK(whole.tensors > codec_only.tensors + 20);  // the discriminators' tensors were compared too
  if (sanitized_build()) return;  // the suite's time: the per-step mode's resumes run in release builds
  CheckDdpResult per_step =
      check_ddp(cfg, data, {.mode = CheckDdpOptions::Mode::per_step, .world = 3, .steps = 4, .print = false});
  CHECK_MESSAGE(per_step.passed, per_step.first_failure);
}

namespace {

// What parse_config says of `j` as "gan.json" ("" when it accepts it).
std::string error_of(const nlohmann::json& j) {
  try {
    parse_config(j, "gan.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the gan section: refused on other model types and with bad values, naming the key") {
  nlohmann::json base = gan_config("unused", 4).source;
  nlohmann::json mlp = base;
  mlp["model"] = {{"type", "mlp"}};
  CHECK(error_of(mlp).find("'gan'") != std::string::npos);
  nlohmann::json p = base;
  p["gan"]["update_probability"] = 0;
  CHECK(error_of(p).find("gan.update_probability") != std::string::npos);
  nlohmann::json none = base;
  none["gan"]["periods"] = nlohmann::json::array();
  none["gan"]["stft_windows"] = nlohmann::json::array();
  CHECK(error_of(none).find("gan.periods") != std::string::npos);
  nlohmann::json loss = base;
  loss["gan"]["loss"] = "wasserstein";
  CHECK(error_of(loss).find("gan.loss") != std::string::npos);
  CHECK(error_of(base).empty());
}

TEST_CASE("a GAN run logs the discriminators' and the codec's adversarial losses, and its report plots them") {
  TempDir dir;
  Config cfg = gan_config(dir.path().string() + "/run", 6);
  cfg.schedule.log_every = 1;
  TrainOptions opt;
  opt.print = true;
  train(cfg, gan_data(), opt);
  std::ifstream in(cfg.run.dir + "/metrics.jsonl");
  int adversarial = 0, discriminator = 0;
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("validation_mse")) {
      CHECK(j.contains("validation_stft_distance"));
      continue;
    }
    const int64_t step = j["step"].get<int64_t>();
    CHECK(j.contains("adversarial") == (step > 2));  // past the 2 warm-up steps
    CHECK(j.contains("quantizer"));
    adversarial += j.contains("adversarial");
    discriminator += j.contains("discriminator");
  }
  CHECK(adversarial == 4);
  CHECK(discriminator >= 1);
  const std::string html = render_report(cfg.run.dir);
  CHECK(html.find("adversarial losses") != std::string::npos);
  CHECK(html.find("codec: feature matching") != std::string::npos);
}

// metrics.jsonl's lines without the speed (a clock's, not the run's).
std::vector<nlohmann::json> metrics_lines(const std::string& dir) {
  std::ifstream in(dir + "/metrics.jsonl");
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    j.erase("steps_per_s");
    lines.push_back(j);
  }
  return lines;
}

TEST_CASE("a GAN run stopped and resumed logs the lines of the uninterrupted run, the discriminators' loss included") {
  TempDir dir;
  Dataset data = gan_data();
  Config cfg = gan_config(dir.path().string() + "/straight", 10);
  cfg.schedule.log_every = 1;
  // Stopped after a step that updates the discriminators, resumed at one that
  // does not: a loss carried from the last update would be the stopped
  // process's alone.
  int64_t stop = 3;
  while (!(discriminator_updates(cfg.gan, cfg.run.seed, stop) && !discriminator_updates(cfg.gan, cfg.run.seed, stop + 1)))
    ++stop;
  REQUIRE(stop < 9);
  TrainOptions opt;
  opt.print = true;
  train(cfg, data, opt);
  Config c = cfg;
  c.run.dir = dir.path().string() + "/stopped";
  TrainOptions first = opt;
  first.stop_at_step = stop;
  train(c, data, first);
  TrainOptions second = opt;
  second.resume = c.run.dir + "/checkpoint.safetensors";
  train(c, data, second);
  const std::vector<nlohmann::json> straight = metrics_lines(cfg.run.dir), resumed = metrics_lines(c.run.dir);
  REQUIRE(straight.size() > 10);
  CHECK(resumed == straight);
  for (const nlohmann::json& j : straight)
    if (!j.contains("validation_mse"))
      CHECK(j.contains("discriminator") == discriminator_updates(cfg.gan, cfg.run.seed, j["step"].get<int64_t>()));
}

TEST_CASE("the gan section's lists: a period or window given twice, and discriminator widths beyond the limit, "
          "are refused naming the key") {
  nlohmann::json base = gan_config("unused", 4).source;
  nlohmann::json periods = base;
  periods["gan"]["periods"] = {2, 2, 2};
  CHECK(error_of(periods).find("gan.json: 'gan.periods' lists 2 twice") != std::string::npos);
  nlohmann::json windows = base;
  windows["gan"]["stft_windows"] = {32, 16, 32};
  CHECK(error_of(windows).find("gan.json: 'gan.stft_windows' lists 32 twice") != std::string::npos);
  nlohmann::json channels = base;
  channels["gan"]["period_channels"] = {65536, 65536, 65536};
  CHECK(error_of(channels).find("'gan.period_channels[0]' must be in [1, 4096], got 65536") != std::string::npos);
  nlohmann::json filters = base;
  filters["gan"]["stft_filters"] = 65536;
  CHECK(error_of(filters).find("'gan.stft_filters' must be in [1, 4096], got 65536") != std::string::npos);
  // Within the widths, one example's activations beyond a tensor's limit.
  nlohmann::json wide = base;
  wide["gan"]["stft_filters"] = 4096;
  wide["data"]["frame"] = 1 << 20;
  wide["model"]["strides"] = {2, 2};
  CHECK(error_of(wide).find("'gan.stft_filters' gives stft_filters x 2 data.frame") != std::string::npos);
  // At a low sample rate EnCodec's scales round to one window: one discriminator for it.
  CHECK(default_stft_windows(400) == std::vector<int64_t>{32, 16});
  GanConfig defaults = gan_config("unused", 4).gan;
  defaults.stft_windows_given = false;
  defaults.stft_windows.clear();
  Discriminators low(defaults, 64, 400, 0);
  CHECK(low.size() == 2 + 2);
}

}  // namespace gan_test
