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

int64_t load_checkpoint(const std::string& path, Module& model, Optimizer& optim) {
  SafetensorsFile f = safetensors_load(path);
  auto fmt_it = f.metadata.find("format");
  VQDDP_CHECK(fmt_it != f.metadata.end() && fmt_it->second == kFormat, "{}: not a vqddp checkpoint (format '{}')", path,
              fmt_it == f.metadata.end() ? "" : fmt_it->second);
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
