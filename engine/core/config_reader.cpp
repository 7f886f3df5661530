#include "engine/core/config_reader.h"

#include <fmt/format.h>

#include "engine/core/count_limits.h"
#include "engine/core/error.h"

namespace vqddp {

namespace {

const nlohmann::json& empty_object() {
  static const nlohmann::json e = nlohmann::json::object();
  return e;
}

std::string type_of(const nlohmann::json& v) {
  std::string shown = v.dump();
  if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
  return fmt::format("{} {}", v.type_name(), shown);
}

}  // namespace

ConfigSection::ConfigSection(const nlohmann::json& obj, std::string path, std::string file)
    : obj_(obj), path_(std::move(path)), file_(std::move(file)) {
  if (!obj_.is_object())
    VQDDP_THROW("{}: '{}' must be an object, got {}", file_, path_.empty() ? "(root)" : path_, type_of(obj_));
}

std::string ConfigSection::key_path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

void ConfigSection::check_elements(const std::string& key, const std::string& formula,
                                   const std::vector<int64_t>& factors) const {
  std::optional<int64_t> n = limits::product(factors);
  if (!n || *n > limits::kMaxTensorElements)
    fail(key, fmt::format("gives {} = {} elements, more than the {} one tensor may hold", formula,
                          n ? fmt::format("{}", *n) : std::string("more than 2^63"), limits::kMaxTensorElements));
}

void ConfigSection::fail(const std::string& key, const std::string& what) const {
  VQDDP_THROW("{}: '{}' {}", file_, key_path(key), what);
}

const nlohmann::json* ConfigSection::get(const std::string& key) {
  read_.insert(key);
  auto it = obj_.find(key);
  return it == obj_.end() ? nullptr : &*it;
}

double ConfigSection::number(const std::string& key, double fallback) {
  const nlohmann::json* v = get(key);
  if (!v) return fallback;
  if (!v->is_number()) fail(key, "must be a number, got " + type_of(*v));
  return v->get<double>();
}

int64_t ConfigSection::checked_integer(const std::string& key, const nlohmann::json& v, CountRange range) const {
  if (!v.is_number_integer()) fail(key, "must be an integer, got " + type_of(v));
  bool too_big = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(range.hi);
  if (too_big || !range.contains(v.get<int64_t>())) fail(key, range.violation(v.dump()));
  return v.get<int64_t>();
}

int64_t ConfigSection::integer(const std::string& key, int64_t fallback, CountRange range) {
  const nlohmann::json* v = get(key);
  return v ? checked_integer(key, *v, range) : fallback;
}

uint64_t ConfigSection::unsigned_integer(const std::string& key, uint64_t fallback) {
  const nlohmann::json* v = get(key);
  if (!v) return fallback;
  // (Parsed text holds a non-negative integer as unsigned, a json built in
  // code as signed.)
  if (!v->is_number_integer() || (!v->is_number_unsigned() && v->get<int64_t>() < 0))
    fail(key, "must be an integer in [0, 2^64 - 1], got " + type_of(*v));
  return v->get<uint64_t>();
}

bool ConfigSection::boolean(const std::string& key, bool fallback) {
  const nlohmann::json* v = get(key);
  if (!v) return fallback;
  if (!v->is_boolean()) fail(key, "must be true or false, got " + type_of(*v));
  return v->get<bool>();
}

std::string ConfigSection::string(const std::string& key, const std::string& fallback) {
  const nlohmann::json* v = get(key);
  if (!v) return fallback;
  if (!v->is_string()) fail(key, "must be a string, got " + type_of(*v));
  // A "\u0000" would cut every C string made of it (a path, a message)
  // where it stands: refused, not silently shortened.
  if (v->get_ref<const std::string&>().find('\0') != std::string::npos) fail(key, "holds a NUL character (\\u0000)");
  return v->get<std::string>();
}

std::string ConfigSection::choice(const std::string& key, const std::string& fallback,
                                  const std::vector<std::string>& choices) {
  std::string v = string(key, fallback);
  for (const auto& c : choices)
    if (v == c) return v;
  fail(key, fmt::format("must be one of \"{}\", got \"{}\"", fmt::join(choices, "\", \""), v));
}

std::vector<int64_t> ConfigSection::integers(const std::string& key, const std::vector<int64_t>& fallback,
                                             CountRange range) {
  const nlohmann::json* v = get(key);
  if (!v) return fallback;
  if (!v->is_array()) fail(key, "must be an array of integers, got " + type_of(*v));
  std::vector<int64_t> out;
  for (size_t i = 0; i < v->size(); ++i)
    out.push_back(checked_integer(fmt::format("{}[{}]", key, i), (*v)[i], range));
  return out;
}

std::vector<double> ConfigSection::numbers(const std::string& key, const std::vector<double>& fallback) {
  const nlohmann::json* v = get(key);
  if (!v) return fallback;
  if (!v->is_array()) fail(key, "must be an array of numbers, got " + type_of(*v));
  std::vector<double> out;
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_number()) fail(fmt::format("{}[{}]", key, i), "must be a number, got " + type_of((*v)[i]));
    out.push_back((*v)[i].get<double>());
  }
  return out;
}

bool ConfigSection::has(const std::string& key) const { return obj_.is_object() && obj_.contains(key); }

ConfigSection ConfigSection::section(const std::string& key) {
  const nlohmann::json* v = get(key);
  return ConfigSection(v ? *v : empty_object(), key_path(key), file_);
}

std::vector<ConfigSection> ConfigSection::sections(const std::string& key) {
  const nlohmann::json* v = get(key);
  std::vector<ConfigSection> out;
  if (!v) return out;
  if (!v->is_array()) fail(key, "must be an array of objects, got " + type_of(*v));
  for (size_t i = 0; i < v->size(); ++i) out.emplace_back((*v)[i], fmt::format("{}[{}]", key_path(key), i), file_);
  return out;
}

void ConfigSection::finish(const std::string& context) const {
  for (auto it = obj_.begin(); it != obj_.end(); ++it)
    if (!read_.count(it.key()))
      VQDDP_THROW("{}: unknown key '{}'{}{} (known here: {})", file_, key_path(it.key()), context.empty() ? "" : " ",
                  context, fmt::join(read_, ", "));
}

}  // namespace vqddp
