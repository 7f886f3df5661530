#include "train/checkpoint.h"

#include <map>

#include "engine/core/json_strict.h"

namespace vqddp {

namespace {
constexpr const char* kFormat = "vqddp-checkpoint/2";           // what save_checkpoint writes: checksummed
constexpr const char* kFormatUnchecked = "vqddp-checkpoint/1";  // before checksums: loads unverified

// A module's part of a checkpoint, under `prefix`: what inference needs of
// the codec (prefix "").
NamedTensors module_tensors(const Module& module, const std::string& prefix) {
  NamedTensors out;
  for (auto& [n, t] : module.named_parameters()) out.emplace_back(prefix + "param." + n, t);
  for (auto& [n, t] : module.named_buffers()) out.emplace_back(prefix + "buffer." + n, t);
  return out;
}

// The value ranges a module's buffers registered, under `prefix`.
void add_buffer_ranges(const Module& module, const std::string& prefix, std::map<std::string, ValueRange>& ranges) {
  for (auto& [n, r] : module.named_buffer_ranges()) ranges[prefix + "buffer." + n] = r;
}

// Whether `name` is a tensor of a part other than the codec (a part's
// prefix, then "param.", "buffer." or "optim."): a weights-only load of
// the codec passes over it.
bool another_parts_tensor(const std::string& name) {
  const size_t dot = name.find('.');
  if (dot == std::string::npos || dot == 0) return false;
  const std::string head = name.substr(0, dot), rest = name.substr(dot + 1);
  if (head == "param" || head == "buffer" || head == "optim" || head == "train") return false;
  return rest.starts_with("param.") || rest.starts_with("buffer.") || rest.starts_with("optim.");
}

}  // namespace

NamedTensors checkpoint_tensors(std::span<const TrainedPart> parts) {
  NamedTensors out;
  for (const TrainedPart& part : parts) {
    for (auto& named : module_tensors(part.module, part.prefix)) out.push_back(std::move(named));
    for (auto& [n, t] : part.optim.state()) out.emplace_back(part.prefix + "optim." + n, t);
  }
  return out;
}

void save_checkpoint(const std::string& path, std::span<const TrainedPart> parts, int64_t step, int64_t total_steps,
                     const nlohmann::json& config, const nlohmann::json& data) {
  NamedTensors all = checkpoint_tensors(parts);
  all.emplace_back("train.step", full({1}, static_cast<double>(step), DType::i64));
  std::map<std::string, std::string> meta{
      {"format", kFormat}, {"config", config.dump()}, {"total_steps", std::to_string(total_steps)}};
  if (!data.is_null()) meta["data"] = data.dump();
  safetensors_save(path, all, meta);
}

nlohmann::json data_facts(int64_t example_dim, int64_t sample_rate) {
  return {{"example_dim", example_dim}, {"sample_rate", sample_rate}};
}

nlohmann::json checkpoint_data_facts(const SafetensorsFile& f) {
  auto text = f.metadata.find("data");
  if (text == f.metadata.end()) return nullptr;
  nlohmann::json j = parse_json_strict(text->second, f.path + ": __metadata__ 'data'");
  for (const char* key : {"example_dim", "sample_rate"})
    VQDDP_CHECK(j.is_object() && j.contains(key) && j[key].is_number_integer() && j[key].get<int64_t>() >= 0,
                "{}: __metadata__ 'data' has no count '{}'", f.path, key);
  return j;
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


// Every tensor of `live` from the checkpoint, all checked before any is
// changed, so a mismatch changes nothing: each present with the model's
// shape and dtype, the file holding no tensor the model lacks (besides the
// step, and with `weights_only` the optimizer state and the other parts'
// tensors), every value finite and within the range `ranges` holds for it
// (what its module or optimizer registered).
void copy_checked(const SafetensorsFile& f, NamedTensors live, const std::map<std::string, ValueRange>& ranges,
                  bool weights_only) {
  const std::string& path = f.path;
  for (const auto& [name, t] : live) {
    VQDDP_CHECK(f.contains(name), "{}: does not match the model: tensor '{}' is missing from the checkpoint", path, name);
    const Tensor& stored_t = f.at(name);
    VQDDP_CHECK(stored_t.shape() == t.shape() && stored_t.dtype() == t.dtype(),
                "{}: does not match the model: tensor '{}' is {} in the checkpoint, {} in the model", path, name,
                stored_t.desc(), t.desc());
  }
  for (const auto& [name, _] : f.tensors) {
    bool known = name == "train.step" || (weights_only && (name.starts_with("optim.") || another_parts_tensor(name)));
    for (const auto& [n, _] : live) known |= n == name;
    VQDDP_CHECK(known, "{}: does not match the model: the checkpoint has tensor '{}', the model does not", path, name);
  }
  for (const auto& [name, _] : live) {
    auto rule = ranges.find(name);
    std::string bad = value_range_violation(f.at(name), rule == ranges.end() ? ValueRange{} : rule->second);
    VQDDP_CHECK(bad.empty(), "{}: tensor '{}' holds {}", path, name, bad);
  }
  for (auto& [name, t] : live) t.copy_(f.at(name));
}

}  // namespace

nlohmann::json continuation_keys(const nlohmann::json& c) {
  nlohmann::json out = nlohmann::json::object();
  for (const char* section : {"model", "quantizer", "data", "optimizer", "gan"})
    out[section] = c.contains(section) ? c[section] : nlohmann::json::object();
  nlohmann::json schedule = c.value("schedule", nlohmann::json::object());
  for (const char* key : {"batch_size", "drop_last"})
    if (schedule.contains(key)) out["schedule"][key] = schedule[key];
  nlohmann::json run = c.value("run", nlohmann::json::object());
  if (run.contains("seed")) out["run"]["seed"] = run["seed"];
  // Another precision changes every product's bits (engine/precision.h).
  // fp32 is the default, and a checkpoint from before the key has none: it
  // is kept only when it is not fp32, so those compare equal.
  if (run.contains("precision") && run["precision"] != "fp32") out["run"]["precision"] = run["precision"];
  return out;
}

SafetensorsFile read_checkpoint(const std::string& path) {
  SafetensorsFile f = safetensors_load(path);
  auto format = f.metadata.find("format");
  std::string name = format == f.metadata.end() ? "" : format->second;
  VQDDP_CHECK(name == kFormat || name == kFormatUnchecked, "{}: not a vqddp checkpoint (format '{}')", path, name);
  // Format 2 without checksums is a damaged header (a lost metadata key),
  // not an old file: it must not pass as one that need not be checked.
  VQDDP_CHECK(name != kFormat || f.checksummed,
              "{}: a {} file must carry checksums but its __metadata__ has none: the header is damaged", path, kFormat);
  return f;
}

int64_t checkpoint_step(const SafetensorsFile& f) {
  const Tensor& t = f.at("train.step");
  VQDDP_CHECK(t.dtype() == DType::i64 && t.shape() == Shape{1}, "{}: tensor 'train.step' is {}{}, expected int64[1]",
              f.path, dtype_name(t.dtype()), shape_str(t.shape()));
  int64_t step = t.item<int64_t>();
  VQDDP_CHECK(step >= 0, "{}: tensor 'train.step' holds {}: a step count cannot be negative", f.path, step);
  return step;
}

nlohmann::json checkpoint_config(const SafetensorsFile& f) {
  auto text = f.metadata.find("config");
  VQDDP_CHECK(text != f.metadata.end(), "{}: __metadata__ has no 'config'", f.path);
  return parse_json_strict(text->second, f.path + ": __metadata__ 'config'");
}

int64_t load_checkpoint(const std::string& path, std::span<const TrainedPart> parts, int64_t total_steps,
                        const nlohmann::json* config) {
  SafetensorsFile f = read_checkpoint(path);
  int64_t step = checkpoint_step(f);
  VQDDP_CHECK(step <= total_steps, "{}: tensor 'train.step' holds {}, past the {} steps of this run's schedule", path,
              step, total_steps);
  nlohmann::json stored = checkpoint_config(f);
  if (config) {
    std::string diff = first_difference(continuation_keys(stored), continuation_keys(*config), "");
    VQDDP_CHECK(diff.empty(), "{}: the run's config differs from the checkpoint's at '{}': resuming would not continue "
                "the same run", path, diff);
  }
  // The run's length is not in its config file (--steps changes it), so the
  // checkpoint keeps it. Under a cosine schedule every step's learning rate
  // depends on it: a resume with another length would change them all.
  auto length = f.metadata.find("total_steps");
  const bool cosine = stored.contains("optimizer") && stored["optimizer"].is_object() &&
                      stored["optimizer"].value("lr_schedule", "") == "cosine";
  if (cosine && length != f.metadata.end())
    VQDDP_CHECK(length->second == std::to_string(total_steps),
                "{}: the checkpoint's run is {} steps long, this one {}: under lr_schedule \"cosine\" every step's "
                "learning rate depends on the run's length, so resuming with another --steps or schedule.epochs would "
                "not continue the same run; resume with the checkpoint's length, or start a new run from it with "
                "another schedule",
                path, length->second, total_steps);
  std::map<std::string, ValueRange> ranges;
  for (const TrainedPart& part : parts) {
    for (auto& [n, r] : part.optim.state_ranges()) ranges[part.prefix + "optim." + n] = r;
    add_buffer_ranges(part.module, part.prefix, ranges);
  }
  copy_checked(f, checkpoint_tensors(parts), ranges, false);
  return step;
}

int64_t load_model_weights(const SafetensorsFile& f, Module& model) {
  std::map<std::string, ValueRange> ranges;
  add_buffer_ranges(model, "", ranges);
  copy_checked(f, module_tensors(model, ""), ranges, true);
  return checkpoint_step(f);
}

}  // namespace vqddp
