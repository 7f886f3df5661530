#include "train/checkpoint.h"

#include "engine/safetensors.h"

namespace vqddp {

namespace {
constexpr const char* kFormat = "vqddp-checkpoint/1";
}

NamedTensors checkpoint_tensors(const Module& model, Optimizer& optim) {
  NamedTensors out;
  for (auto& [n, t] : model.named_parameters()) out.emplace_back("param." + n, t);
  for (auto& [n, t] : model.named_buffers()) out.emplace_back("buffer." + n, t);
  for (auto& [n, t] : optim.state()) out.emplace_back("optim." + n, t);
  return out;
}

void save_checkpoint(const std::string& path, const Module& model, Optimizer& optim, int64_t step,
                     const nlohmann::json& config) {
  NamedTensors all = checkpoint_tensors(model, optim);
  all.emplace_back("train.step", full({1}, static_cast<double>(step), DType::i64));
  safetensors_save(path, all, {{"format", kFormat}, {"config", config.dump()}});
}

namespace {

// The first key path where `a` and `b` differ ("" if equal).
std::string first_difference(const nlohmann::json& a, const nlohmann::json& b, const std::string& path) {
  if (a.is_object() && b.is_object()) {
    for (auto it = a.begin(); it != a.end(); ++it) {
      std::string p = path.empty() ? it.key() : path + "." + it.key();
      if (!b.contains(it.key())) return p;
      std::string d = first_difference(it.value(), b[it.key()], p);
      if (!d.empty()) return d;
    }
    for (auto it = b.begin(); it != b.end(); ++it)
      if (!a.contains(it.key())) return path.empty() ? it.key() : path + "." + it.key();
    return "";
  }
  return a == b ? "" : path;
}

// The parts of a config that a bit-exact continuation depends on.
nlohmann::json continuation_keys(const nlohmann::json& c) {
  nlohmann::json out = nlohmann::json::object();
  for (const char* section : {"model", "quantizer", "data", "optimizer"})
    out[section] = c.contains(section) ? c[section] : nlohmann::json::object();
  nlohmann::json schedule = c.value("schedule", nlohmann::json::object());
  for (const char* key : {"batch_size", "drop_last"})
    if (schedule.contains(key)) out["schedule"][key] = schedule[key];
  nlohmann::json run = c.value("run", nlohmann::json::object());
  if (run.contains("seed")) out["run"]["seed"] = run["seed"];
  return out;
}

}  // namespace

int64_t load_checkpoint(const std::string& path, Module& model, Optimizer& optim, const nlohmann::json* config) {
  SafetensorsFile f = safetensors_load(path);
  auto fmt_it = f.metadata.find("format");
  VQDDP_CHECK(fmt_it != f.metadata.end() && fmt_it->second == kFormat, "{}: not a vqddp checkpoint (format '{}')", path,
              fmt_it == f.metadata.end() ? "" : fmt_it->second);
  if (config) {
    nlohmann::json stored = nlohmann::json::parse(f.metadata.count("config") ? f.metadata.at("config") : "{}");
    std::string diff = first_difference(continuation_keys(stored), continuation_keys(*config), "");
    VQDDP_CHECK(diff.empty(), "{}: the run's config differs from the checkpoint's at '{}': resuming would not continue "
                "the same run", path, diff);
  }
  NamedTensors live = checkpoint_tensors(model, optim);
  // Check everything first, so a mismatch changes nothing.
  for (const auto& [name, t] : live) {
    VQDDP_CHECK(f.contains(name), "{}: does not match the model: tensor '{}' is missing from the checkpoint", path, name);
    const Tensor& stored = f.at(name);
    VQDDP_CHECK(stored.shape() == t.shape() && stored.dtype() == t.dtype(),
                "{}: does not match the model: tensor '{}' is {} in the checkpoint, {} in the model", path, name,
                stored.desc(), t.desc());
  }
  for (const auto& [name, t] : f.tensors) {
    bool known = name == "train.step";
    for (const auto& [n, _] : live) known |= n == name;
    VQDDP_CHECK(known, "{}: does not match the model: the checkpoint has tensor '{}', the model does not", path, name);
  }
  VQDDP_CHECK(f.contains("train.step"), "{}: missing tensor 'train.step'", path);
  for (auto& [name, t] : live) t.copy_(f.at(name));
  return f.at("train.step").item<int64_t>();
}

}  // namespace vqddp
