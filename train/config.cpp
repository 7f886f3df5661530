#include "train/config.h"

#include <fmt/format.h>

#include "engine/error.h"
#include "engine/file_io.h"
#include "train/config_reader.h"
#include "vqddp_default_config.h"

namespace vqddp {

namespace {

void read_model(ConfigSection s, ModelConfig& m) {
  m.hidden = s.integer("hidden", m.hidden);
  m.hidden_layers = static_cast<int>(s.integer("hidden_layers", m.hidden_layers));
  m.latent_dim = s.integer("latent_dim", m.latent_dim);
  m.tokens = s.integer("tokens", m.tokens);
  m.activation = s.choice("activation", m.activation, {"gelu", "relu", "tanh"});
  m.sigmoid_output = s.boolean("sigmoid_output", m.sigmoid_output);
  if (m.hidden < 1 || m.hidden_layers < 1 || m.latent_dim < 1 || m.tokens < 1)
    s.fail("hidden", "and hidden_layers, latent_dim, tokens must all be positive");
  s.finish();
}

void read_quantizer(ConfigSection s, QuantizerConfig& q) {
  q.type = s.choice("type", q.type, {"vq", "residual_vq", "fsq", "residual_fsq"});
  q.codebook_size = s.integer("codebook_size", q.codebook_size);
  q.num_quantizers = static_cast<int>(s.integer("num_quantizers", q.num_quantizers));
  q.codebook_dim = s.integer("codebook_dim", q.codebook_dim);
  q.shared_codebook = s.boolean("shared_codebook", q.shared_codebook);
  q.commitment_weight = static_cast<float>(s.number("commitment_weight", q.commitment_weight));
  CodebookOptions& c = q.codebook;
  c.decay = static_cast<float>(s.number("decay", c.decay));
  c.eps = static_cast<float>(s.number("eps", c.eps));
  c.threshold_ema_dead_code = static_cast<float>(s.number("threshold_ema_dead_code", c.threshold_ema_dead_code));
  c.kmeans_init = s.boolean("kmeans_init", c.kmeans_init);
  c.kmeans_iters = static_cast<int>(s.integer("kmeans_iters", c.kmeans_iters));
  c.cosine = s.boolean("use_cosine_sim", c.cosine);
  c.learnable = s.boolean("learnable_codebook", c.learnable);
  c.cluster_size_init_ones = s.choice("cluster_size_init", "ones", {"ones", "zeros"}) == "ones";
  c.sync_stats = s.boolean("sync_codebook", c.sync_stats);
  q.quantize_dropout = s.boolean("quantize_dropout", q.quantize_dropout);
  q.quantize_dropout_cutoff_index = static_cast<int>(s.integer("quantize_dropout_cutoff_index", 0));
  q.quantize_dropout_multiple_of = static_cast<int>(s.integer("quantize_dropout_multiple_of", 1));
  for (int64_t l : s.integers("levels", {})) q.levels.push_back(static_cast<int>(l));
  if (!(c.decay >= 0 && c.decay <= 1)) s.fail("decay", "must be in [0, 1]");
  if (!(c.eps > 0)) s.fail("eps", "must be positive");
  if (!(c.threshold_ema_dead_code >= 0)) s.fail("threshold_ema_dead_code", "must not be negative");
  if (c.kmeans_init && c.kmeans_iters < 1) s.fail("kmeans_iters", "must be at least 1 with kmeans_init");
  for (int l : q.levels)
    if (l < 2) s.fail("levels", fmt::format("must all be at least 2, got {}", l));
  if (q.quantize_dropout_cutoff_index < 0 || q.quantize_dropout_cutoff_index >= q.num_quantizers)
    s.fail("quantize_dropout_cutoff_index", fmt::format("must be in [0, num_quantizers = {})", q.num_quantizers));
  if (q.quantize_dropout_multiple_of < 1) s.fail("quantize_dropout_multiple_of", "must be at least 1");
  bool fsq = q.type == "fsq" || q.type == "residual_fsq";
  if (fsq && q.levels.empty()) s.fail("levels", "is required for type \"" + q.type + "\"");
  if (!fsq && !q.levels.empty()) s.fail("levels", "applies to fsq and residual_fsq only");
  if (q.codebook_size < 2 || q.num_quantizers < 1) s.fail("codebook_size", "must be >= 2 and num_quantizers >= 1");
  s.finish();
}

void read_data(ConfigSection s, DataConfig& d) {
  d.type = s.choice("type", d.type, {"wav_frames", "fashion_mnist"});
  for (ConfigSection src : s.sections("sources")) {
    DataSourceConfig c;
    c.path = src.string("path", "");
    if (c.path.empty()) src.fail("path", "is required");
    c.weight = src.number("weight", 1.0);
    if (!(c.weight > 0)) src.fail("weight", "must be positive");
    src.finish();
    d.sources.push_back(c);
  }
  if (d.sources.empty()) s.fail("sources", "needs at least one {\"path\": ...} entry");
  d.frame = s.integer("frame", d.frame);
  d.max_files = s.integer("max_files", d.max_files);
  d.holdout_every = s.integer("holdout_every", d.holdout_every);
  d.validation_path = s.string("validation_path", d.validation_path);
  d.max_examples = s.integer("max_examples", d.max_examples);
  if (d.frame < 1 || d.holdout_every < 2) s.fail("frame", "must be positive and holdout_every at least 2");
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
  if (!(o.lr > 0)) s.fail("lr", "must be positive");
  s.finish();
}

void read_schedule(ConfigSection s, ScheduleConfig& c) {
  c.batch_size = s.integer("batch_size", c.batch_size);
  c.epochs = s.integer("epochs", c.epochs);
  c.steps = s.integer("steps", c.steps);
  c.validate_every = s.integer("validate_every", c.validate_every);
  c.checkpoint_every = s.integer("checkpoint_every", c.checkpoint_every);
  c.log_every = s.integer("log_every", c.log_every);
  c.drop_last = s.boolean("drop_last", c.drop_last);
  if (c.batch_size < 1) s.fail("batch_size", "must be positive");
  if (c.epochs < 1 && c.steps < 1) s.fail("epochs", "or steps must be positive");
  if (c.validate_every < 0 || c.checkpoint_every < 0 || c.log_every < 1)
    s.fail("validate_every", "and checkpoint_every must be >= 0, log_every >= 1");
  s.finish();
}

void read_distributed(ConfigSection s, DistributedConfig& d) {
  d.backend = s.string("backend", d.backend);
  d.world_size = static_cast<int>(s.integer("world_size", d.world_size));
  d.timeout_s = s.number("timeout_s", d.timeout_s);
  d.check_collectives = s.boolean("check_collectives", d.check_collectives);
  if (d.world_size < 1 || !(d.timeout_s > 0)) s.fail("world_size", "must be positive, and timeout_s too");
  s.finish();
}

void read_run(ConfigSection s, RunConfig& r) {
  r.dir = s.string("dir", r.dir);
  int64_t seed = s.integer("seed", 0);
  if (seed < 0) s.fail("seed", "must not be negative");
  r.seed = static_cast<uint64_t>(seed);
  r.device = s.choice("device", r.device, run_device_names());
  s.finish();
}

}  // namespace

Config parse_config(const nlohmann::json& j, const std::string& file) {
  Config c;
  ConfigSection root(j, "", file);
  read_model(root.section("model"), c.model);
  read_quantizer(root.section("quantizer"), c.quantizer);
  read_data(root.section("data"), c.data);
  read_optimizer(root.section("optimizer"), c.optimizer);
  read_schedule(root.section("schedule"), c.schedule);
  read_distributed(root.section("distributed"), c.distributed);
  read_run(root.section("run"), c.run);
  root.finish();
  c.source = j;
  return c;
}

Config parse_config_text(const std::string& text, const std::string& origin) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text, nullptr, true, /*ignore_comments=*/true);
  } catch (const nlohmann::json::exception& e) {
    VQDDP_THROW("{}: not valid JSON: {}", origin, e.what());
  }
  return parse_config(j, origin);
}

Config load_config(const std::string& path) {
  std::string text;
  try {
    text = read_file(path);
  } catch (const Error& e) {
    VQDDP_THROW("{}: cannot open config file ({})", path, e.what());
  }
  return parse_config_text(text, path);
}

const std::vector<std::string>& run_device_names() {
  static const std::vector<std::string> names{"cpu", "cuda"};
  return names;
}

const char* default_config_json() { return kDefaultConfigJson; }

}  // namespace vqddp
