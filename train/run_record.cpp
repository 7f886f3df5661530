#include "train/run_record.h"

#include "engine/core/error.h"

namespace vqddp {

using nlohmann::json;

namespace {

// j[key] when j is an object holding a number there.
std::optional<double> number(const json& j, const char* key) {
  if (!j.is_object()) return std::nullopt;
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

std::optional<int64_t> integer(const json& j, const char* key) {
  std::optional<double> v = number(j, key);
  if (!v || !(*v >= -0x1p63 && *v < 0x1p63)) return std::nullopt;  // beyond int64: not a count we wrote
  return static_cast<int64_t>(*v);
}

std::string text(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

template <class T>
void put(json& j, const char* key, const std::optional<T>& v) {
  if (v) j[key] = *v;  // a NaN is written as null by the JSON writer
}

json layers_json(const std::vector<LayerUse>& layers) {
  json out = json::array();
  for (const LayerUse& u : layers) {
    json l = json::object();
    put(l, "perplexity", u.perplexity);
    put(l, "codes_used", u.codes_used);
    out.push_back(l);
  }
  return out;
}

std::vector<LayerUse> layers_of(const json& j, const char* key) {
  std::vector<LayerUse> out;
  auto it = j.find(key);
  if (it == j.end() || !it->is_array()) return out;
  for (const json& l : *it) out.push_back({number(l, "perplexity"), integer(l, "codes_used")});
  return out;
}

}  // namespace

json to_json(const RunFacts& r) {
  json j{{"description", r.description}, {"backend", r.backend}, {"device", r.device}, {"layer_sizes", r.layer_sizes}};
  put(j, "world_size", r.world_size);
  put(j, "total_steps", r.total_steps);
  put(j, "bits_per_example", r.bits_per_example);
  put(j, "bitrate", r.bitrate);
  put(j, "sample_rate", r.sample_rate);
  put(j, "example_dim", r.example_dim);
  if (!r.config.is_null()) j["config"] = r.config;
  return j;
}

json to_json(const TrainLine& l) {
  json j{{"step", l.step}};
  put(j, "loss", l.loss);
  put(j, "recon", l.recon);
  put(j, "quantizer", l.quantizer);
  put(j, "discriminator", l.discriminator);
  put(j, "adversarial", l.adversarial);
  put(j, "feature", l.feature);
  put(j, "revived", l.revived);
  put(j, "lr", l.lr);
  put(j, "steps_per_s", l.steps_per_s);
  if (!l.layers.empty()) j["layers"] = layers_json(l.layers);
  if (l.skipped_rows > 0) j["skipped_rows"] = l.skipped_rows;
  return j;
}

json to_json(const ValidationLine& l) {
  // Every key but the step starts with "validation_": is_validation_line's rule.
  json j{{"step", l.step}};
  put(j, "validation_mse", l.mse);
  put(j, "validation_snr_db", l.snr_db);
  put(j, "validation_log_mel_l1", l.log_mel_l1);
  put(j, "validation_stft_distance", l.stft_distance);
  put(j, "validation_stoi", l.stoi);
  if (l.skipped_rows > 0) j["validation_skipped_rows"] = l.skipped_rows;
  if (!l.layers.empty()) j["validation_layers"] = layers_json(l.layers);
  return j;
}

json to_json(const CodeUsage& u) {
  json j{{"step", u.step}, {"layers", json::array()}};
  for (const std::vector<int64_t>& c : u.counts) j["layers"].push_back({{"codebook_size", c.size()}, {"counts", c}});
  return j;
}

RunFacts run_facts_from_json(const json& j, const std::string& where) {
  VQDDP_CHECK(j.is_object(), "{}: malformed: not a JSON object", where);
  RunFacts r;
  r.description = text(j, "description");
  r.backend = text(j, "backend");
  r.device = text(j, "device");
  r.world_size = integer(j, "world_size");
  r.total_steps = integer(j, "total_steps");
  r.bits_per_example = number(j, "bits_per_example");
  r.bitrate = number(j, "bitrate");
  r.sample_rate = integer(j, "sample_rate");
  r.example_dim = integer(j, "example_dim");
  if (auto it = j.find("layer_sizes"); it != j.end() && it->is_array())
    for (const json& k : *it) r.layer_sizes.push_back(k.is_number_integer() ? k.get<int64_t>() : 0);
  if (auto it = j.find("config"); it != j.end()) r.config = *it;
  return r;
}

CodeUsage code_usage_from_json(const json& j, const std::string& where) {
  VQDDP_CHECK(j.is_object(), "{}: malformed: not a JSON object", where);
  VQDDP_CHECK(j.contains("layers") && j["layers"].is_array(), "{}: malformed: no \"layers\" array", where);
  CodeUsage u;
  u.step = integer(j, "step").value_or(0);
  for (size_t i = 0; i < j["layers"].size(); ++i) {
    const json& layer = j["layers"][i];
    VQDDP_CHECK(layer.is_object() && layer.contains("counts") && layer["counts"].is_array(),
                "{}: malformed: layer {} has no \"counts\" array", where, i);
    std::vector<int64_t>& counts = u.counts.emplace_back();
    for (const json& c : layer["counts"]) counts.push_back(c.is_number() ? static_cast<int64_t>(c.get<double>()) : 0);
  }
  return u;
}

bool is_validation_line(const json& j) {
  if (!j.is_object()) return false;
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key().starts_with("validation_")) return true;
  return false;
}

std::optional<TrainLine> train_line_from_json(const json& j) {
  std::optional<int64_t> step = integer(j, "step");
  if (!step || is_validation_line(j)) return std::nullopt;
  TrainLine l;
  l.step = *step;
  l.loss = number(j, "loss");
  l.recon = number(j, "recon");
  l.quantizer = number(j, "quantizer");
  l.discriminator = number(j, "discriminator");
  l.adversarial = number(j, "adversarial");
  l.feature = number(j, "feature");
  l.revived = integer(j, "revived");
  l.lr = number(j, "lr");
  l.steps_per_s = number(j, "steps_per_s");
  l.layers = layers_of(j, "layers");
  l.skipped_rows = integer(j, "skipped_rows").value_or(0);
  return l;
}

std::optional<ValidationLine> validation_line_from_json(const json& j) {
  std::optional<int64_t> step = integer(j, "step");
  if (!step || !is_validation_line(j)) return std::nullopt;
  ValidationLine l;
  l.step = *step;
  l.mse = number(j, "validation_mse");
  l.snr_db = number(j, "validation_snr_db");
  l.log_mel_l1 = number(j, "validation_log_mel_l1");
  l.stft_distance = number(j, "validation_stft_distance");
  l.stoi = number(j, "validation_stoi");
  l.layers = layers_of(j, "validation_layers");
  l.skipped_rows = integer(j, "validation_skipped_rows").value_or(0);
  return l;
}

}  // namespace vqddp
