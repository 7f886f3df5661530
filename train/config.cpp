#include "train/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <set>

#include "engine/core/error.h"
#include "engine/core/file_io.h"
#include "engine/core/json_strict.h"
#include "engine/core/config_reader.h"
#include "comm/backends.h"
#include "train/networks.h"
#include "engine/core/count_limits.h"
#include "vq/quantizer_kind.h"

namespace vqddp {

namespace {

// Far above any real config (a few KiB), far below what could exhaust memory.
constexpr int64_t kMaxConfigBytes = int64_t{16} << 20;

// Each model.type reads only its own keys, so a key of another type (hidden
// on conv_codec, strides on mlp) is an unknown key naming the known ones,
// never silently ignored.
void read_model(ConfigSection s, ModelConfig& m) {
  m.type = s.choice("type", m.type, {"mlp", "conv_codec", "conv_vqvae"});
  m.latent_dim = s.integer("latent_dim", m.latent_dim, limits::width);
  m.activation = s.choice("activation", m.activation, {"gelu", "relu", "tanh", "elu", "leaky_relu", "silu"});
  m.sigmoid_output = s.boolean("sigmoid_output", m.sigmoid_output);
  if (m.type == "mlp") {
    m.hidden = s.integer("hidden", m.hidden, limits::width);
    m.hidden_layers = static_cast<int>(s.integer("hidden_layers", m.hidden_layers, limits::hidden_layers));
    m.tokens = s.integer("tokens", m.tokens, limits::width);
  } else {
    m.weight_norm = s.boolean("weight_norm", m.weight_norm);
  }
  if (m.type == "conv_codec") {
    m.channels = s.integers("channels", {32, 64, 128, 256}, limits::width);
    m.strides = s.integers("strides", {2, 4, 5}, limits::conv_stride);
    m.residual_units = s.integer("residual_units", m.residual_units, limits::residual_units);
    m.causal = s.boolean("causal", m.causal);
    m.waveform_loss = s.choice("waveform_loss", m.waveform_loss, {"l1", "l2"});
    m.spectral_weight = s.number("spectral_weight", m.spectral_weight);
    m.mel_weight = s.number("mel_weight", m.mel_weight);
    m.stoi_weight = s.number("stoi_weight", m.stoi_weight);
  }
  if (m.type == "conv_vqvae") m.channels = s.integers("channels", {32, 64}, limits::width);
  if (auto [key, why] = model_config_problem(m); !key.empty()) s.fail(key, why);
  s.finish("for type \"" + m.type + "\"");
}

void read_data(ConfigSection s, DataConfig& d) {
  d.type = s.choice("type", d.type, {"wav_frames", "fashion_mnist"});
  for (ConfigSection src : s.sections("sources")) {
    DataSourceConfig c;
    c.path = src.string("path", "");
    if (c.path.empty()) src.fail("path", "is required");
    c.weight = src.number("weight", 1.0);
    if (!(c.weight > 0)) src.fail("weight", "must be positive");
    c.made_by = src.string("made_by", "");
    src.finish();
    d.sources.push_back(c);
  }
  if (d.sources.empty()) s.fail("sources", "needs at least one {\"path\": ...} entry");
  d.frame = s.integer("frame", d.frame, limits::frame);
  d.max_files = s.integer("max_files", d.max_files, limits::optional_count);
  d.sample_rate = s.integer("sample_rate", d.sample_rate, limits::sample_rate);
  d.holdout_every = s.integer("holdout_every", d.holdout_every, limits::holdout_every);
  d.validation_path = s.string("validation_path", d.validation_path);
  d.max_examples = s.integer("max_examples", d.max_examples, limits::optional_count);
  d.index_dir = s.string("index_dir", d.index_dir);
  d.bad_files = s.choice("bad_files", d.bad_files, {"error", "skip"});
  d.readers = s.integer("readers", d.readers, limits::readers);
  d.prefetch = s.integer("prefetch", d.prefetch, limits::prefetch);
  s.finish();
}

void read_optimizer(ConfigSection s, OptimizerConfig& o) {
  o.type = s.choice("type", o.type, {"adamw", "sgd"});
  o.lr = static_cast<float>(s.number("lr", o.lr));
  o.weight_decay = static_cast<float>(s.number("weight_decay", o.weight_decay));
  o.beta1 = static_cast<float>(s.number("beta1", o.beta1));
  o.beta2 = static_cast<float>(s.number("beta2", o.beta2));
  o.eps = static_cast<float>(s.number("eps", o.eps));
  o.momentum = static_cast<float>(s.number("momentum", o.momentum));
  o.grad_clip = static_cast<float>(s.number("grad_clip", o.grad_clip));
  o.lr_schedule = s.choice("lr_schedule", o.lr_schedule, {"constant", "cosine"});
  o.final_lr_fraction = s.number("final_lr_fraction", o.final_lr_fraction);
  if (!(o.lr > 0)) s.fail("lr", "must be positive");
  // A beta of 1 or more makes AdamW's bias correction 1 - beta^t zero or
  // negative; a negative eps can cancel the denominator; a negative clip
  // would read as "off" (only 0 says that).
  if (!(o.beta1 >= 0 && o.beta1 < 1)) s.fail("beta1", fmt::format("must be in [0, 1), got {}", o.beta1));
  if (!(o.beta2 >= 0 && o.beta2 < 1)) s.fail("beta2", fmt::format("must be in [0, 1), got {}", o.beta2));
  if (!(o.eps > 0)) s.fail("eps", fmt::format("must be positive, got {}", o.eps));
  if (!(o.weight_decay >= 0)) s.fail("weight_decay", fmt::format("must be >= 0, got {}", o.weight_decay));
  if (!(o.momentum >= 0 && o.momentum < 1)) s.fail("momentum", fmt::format("must be in [0, 1), got {}", o.momentum));
  if (!(o.grad_clip >= 0)) s.fail("grad_clip", fmt::format("must be >= 0 (0: no clipping), got {}", o.grad_clip));
  if (!(o.final_lr_fraction >= 0 && o.final_lr_fraction <= 1)) s.fail("final_lr_fraction", "must be in [0, 1]");
  s.finish();
}

// Each discriminator is a module named by its period or window
// (train/discriminators.h): one given twice would be two modules of one name.
void refuse_repeats(const ConfigSection& s, const std::string& key, const std::vector<int64_t>& values) {
  std::set<int64_t> seen;
  for (int64_t v : values)
    if (!seen.insert(v).second) s.fail(key, fmt::format("lists {} twice: one discriminator each", v));
}

void read_gan(ConfigSection s, GanConfig& g) {
  g.enabled = true;
  g.periods = s.integers("periods", g.periods, limits::period);
  refuse_repeats(s, "periods", g.periods);
  g.period_channels = s.integers("period_channels", g.period_channels, limits::discriminator_width);
  g.stft_windows_given = s.has("stft_windows");
  if (g.stft_windows_given) g.stft_windows = s.integers("stft_windows", {}, limits::stft_window);
  refuse_repeats(s, "stft_windows", g.stft_windows);
  g.stft_filters = s.integer("stft_filters", g.stft_filters, limits::discriminator_width);
  g.loss = s.choice("loss", g.loss, {"hinge", "least_squares"});
  g.adversarial_weight = s.number("adversarial_weight", g.adversarial_weight);
  g.feature_weight = s.number("feature_weight", g.feature_weight);
  g.warmup_steps = s.integer("warmup_steps", g.warmup_steps, limits::config_steps);
  g.update_every = s.integer("update_every", g.update_every, limits::log_every);
  g.update_probability = s.number("update_probability", g.update_probability);
  read_optimizer(s.section("optimizer"), g.optimizer);
  if (g.periods.empty() && g.stft_windows_given && g.stft_windows.empty())
    s.fail("periods", "and stft_windows are both empty: a GAN needs at least one discriminator");
  if (!g.periods.empty() && g.period_channels.empty()) s.fail("period_channels", "needs at least one stage");
  if (!(g.adversarial_weight >= 0)) s.fail("adversarial_weight", "must be >= 0");
  if (!(g.feature_weight >= 0)) s.fail("feature_weight", "must be >= 0");
  if (!(g.update_probability > 0 && g.update_probability <= 1)) s.fail("update_probability", "must be in (0, 1]");
  s.finish();
}

void read_schedule(ConfigSection s, ScheduleConfig& c) {
  c.batch_size = s.integer("batch_size", c.batch_size, limits::batch_size);
  c.epochs = s.integer("epochs", c.epochs, limits::epochs);
  c.steps = s.integer("steps", c.steps, limits::config_steps);
  c.validate_every = s.integer("validate_every", c.validate_every, limits::every);
  c.checkpoint_every = s.integer("checkpoint_every", c.checkpoint_every, limits::every);
  c.log_every = s.integer("log_every", c.log_every, limits::log_every);
  c.drop_last = s.boolean("drop_last", c.drop_last);
  if (c.epochs < 1 && c.steps < 1) s.fail("epochs", "or steps must be positive");
  s.finish();
}

void read_distributed(ConfigSection s, DistributedConfig& d) {
  d.backend = s.choice("backend", d.backend, backend_names());  // comm/backends.h: the ones it can start
  d.world_size = static_cast<int>(s.integer("world_size", d.world_size, limits::world));
  d.timeout_s = s.number("timeout_s", d.timeout_s);
  d.check_collectives = s.boolean("check_collectives", d.check_collectives);
  // Milliseconds of it must fit the deadline arithmetic: a year is plenty.
  if (!(d.timeout_s > 0 && d.timeout_s <= 365 * 86400.0))
    s.fail("timeout_s", fmt::format("must be in (0, 31536000] seconds, got {}", d.timeout_s));
  s.finish();
}

void read_run(ConfigSection s, RunConfig& r) {
  r.dir = s.string("dir", r.dir);
  if (r.dir.empty()) s.fail("dir", "must name a directory, got \"\"");
  r.seed = s.unsigned_integer("seed", r.seed);
  r.device = s.choice("device", r.device, run_device_names());
  r.step_graphs_given = s.has("step_graphs");
  r.step_graphs = s.boolean("step_graphs", r.step_graphs);
  r.precision = s.choice("precision", r.precision, {"fp32", "tf32", "bf16"});
  s.finish();
}

// The conv types' weights (train/networks.cpp) and one example's widest
// activation: channels x samples.
void check_conv_sizes(const ConfigSection& root, const ModelConfig& m, const DataConfig& data) {
  const std::vector<int64_t>& ch = m.channels;
  if (m.type == "conv_vqvae") {
    root.check_elements("model.channels", "channels[0] x channels[1] x 4 x 4", {ch[0], ch[1], 16});
    root.check_elements("model.latent_dim", "channels[1] x latent_dim x 3 x 3", {ch[1], m.latent_dim, 9});
    return;
  }
  for (size_t i = 0; i < m.strides.size(); ++i) {
    root.check_elements("model.channels", fmt::format("channels[{}]^2 x 3", i), {ch[i], ch[i], 3});
    root.check_elements("model.channels", fmt::format("channels[{0}] x channels[{1}] x 2 strides[{0}]", i, i + 1),
                        {ch[i], ch[i + 1], 2 * m.strides[i]});
  }
  root.check_elements("model.latent_dim", "channels[-1] x latent_dim x 7", {ch.back(), m.latent_dim, 7});
  if (data.type == "wav_frames") root.check_elements("model.channels", "channels[0] x data.frame", {ch[0], data.frame});
}

// The discriminators' widest activation of one example: a period stage's
// channels x the samples; an STFT one's filters x its about 2 frame values
// (hop a quarter of the window: bins x frames = frame / 2 x 4, at most).
// Their weights are far below the limit at the widths limits:: allows.
void check_gan_sizes(const ConfigSection& root, const GanConfig& g, int64_t frame) {
  if (!g.period_channels.empty())
    root.check_elements("gan.period_channels", "period_channels x data.frame",
                        {*std::max_element(g.period_channels.begin(), g.period_channels.end()), frame});
  root.check_elements("gan.stft_filters", "stft_filters x 2 data.frame", {g.stft_filters, 2, frame});
}

// Sizes whose product a tensor must hold are refused by key before anything
// is allocated (ConfigSection::check_elements); the quantizer's are its reader's.
void check_sizes(const ConfigSection& root, const Config& c) {
  const ModelConfig& m = c.model;
  if (m.type == "mlp") {
    root.check_elements("model.hidden", "hidden x hidden", {m.hidden, m.hidden});
    root.check_elements("model.latent_dim", "hidden x latent_dim x tokens", {m.hidden, m.latent_dim, m.tokens});
    if (c.data.type == "wav_frames") root.check_elements("data.frame", "frame x model.hidden", {c.data.frame, m.hidden});
  } else {
    check_conv_sizes(root, m, c.data);
  }
  if (c.gan.enabled) check_gan_sizes(root, c.gan, c.data.frame);
}

}  // namespace

Config parse_config(const nlohmann::json& j, const std::string& file) {
  Config c;
  ConfigSection root(j, "", file);
  read_model(root.section("model"), c.model);
  // With the model's latent width, so sizes that depend on it are refused by key.
  read_quantizer_options(root.section("quantizer"), c.quantizer, c.model.latent_dim);
  if (!c.quantizer.kind().trains_encoder)
    root.fail("quantizer.type", fmt::format("\"{}\" makes prediction targets (no gradient reaches the encoder), not a "
                                            "model's quantizer; use it from the library (vq/quantizer_options.h)",
                                            c.quantizer.type()));
  read_data(root.section("data"), c.data);
  read_optimizer(root.section("optimizer"), c.optimizer);
  if (root.has("gan")) {
    read_gan(root.section("gan"), c.gan);
    if (c.model.type != "conv_codec" || c.data.type != "wav_frames")
      root.fail("gan", fmt::format("trains a waveform codec's discriminators: it needs model.type \"conv_codec\" and "
                                   "data.type \"wav_frames\", got \"{}\" and \"{}\"", c.model.type, c.data.type));
  }
  read_schedule(root.section("schedule"), c.schedule);
  read_distributed(root.section("distributed"), c.distributed);
  read_run(root.section("run"), c.run);
  root.finish();
  check_sizes(root, c);
  c.source = j;
  return c;
}

Config parse_config(nlohmann::json j, const std::string& file, const std::vector<ConfigOverride>& overrides) {
  if (overrides.empty()) return parse_config(j, file);
  const nlohmann::json given = j;
  std::vector<std::string> flags;
  for (const ConfigOverride& o : overrides) {
    VQDDP_CHECK(j.is_object(), "{}: the config must be a JSON object, got {}", file, j.type_name());
    nlohmann::json* at = &j;
    std::string rest = o.key;
    for (size_t dot; (dot = rest.find('.')) != std::string::npos; rest = rest.substr(dot + 1)) {
      nlohmann::json& next = (*at)[rest.substr(0, dot)];
      if (next.is_null()) next = nlohmann::json::object();
      // A non-object here is the file's own error: parse_config names it.
      if (!next.is_object()) return parse_config(j, file);
      at = &next;
    }
    (*at)[rest] = o.value;
    flags.push_back(o.flag + " " + (o.value.is_string() ? o.value.get<std::string>() : o.value.dump()));
  }
  Config c = parse_config(j, fmt::format("{} with {}", file, fmt::join(flags, " ")));
  c.source = given;  // what checkpoints store: the file's settings, not this command line's
  return c;
}

Config parse_config_text(const std::string& text, const std::string& origin) {
  return parse_config(parse_json_strict(text, origin), origin);
}

nlohmann::json load_config_json(const std::string& path) {
  std::string text;
  try {
    text = read_file(path, kMaxConfigBytes, "a config file");
  } catch (const Error& e) {
    VQDDP_THROW("{}: cannot open config file ({})", path, e.what());
  }
  return parse_json_strict(text, path);
}

Config load_config(const std::string& path) { return parse_config(load_config_json(path), path); }

const std::vector<std::string>& run_device_names() {
  static const std::vector<std::string> names{"cpu", "cuda", "sim"};
  return names;
}

}  // namespace vqddp
