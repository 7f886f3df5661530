#include "train/cli_args.h"

#include <fmt/format.h>

#include "engine/error.h"
#include "engine/parse_number.h"

namespace vqddp {

CliArgs::CliArgs(const std::string& command, int argc, char** argv, int first, const std::set<std::string>& options)
    : command_(command) {
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) {
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else {
      VQDDP_CHECK(options.count(name) == 0 || i + 1 < argc, "{}: option --{} needs a value", command, name);
      if (options.count(name)) value = argv[++i];
    }
    VQDDP_CHECK(options.count(name), "{}: unknown option --{} (known: {})", command, name,
                options.empty() ? std::string("none") : fmt::format("--{}", fmt::join(options, ", --")));
    values_[name] = value;
  }
}

std::string CliArgs::get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

int64_t CliArgs::get_int(const std::string& name, int64_t fallback, CountRange range) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  std::optional<int64_t> v = parse_int(it->second);
  // Digits beyond int64 are a range error, not a wrong type.
  bool digits = !it->second.empty() && it->second.find_first_not_of("-0123456789") == std::string::npos;
  VQDDP_CHECK(v || digits, "{}: --{} expects an integer, got '{}'", command_, name, it->second);
  VQDDP_CHECK(v && range.contains(*v), "{}: --{} {}", command_, name, range.violation(it->second));
  return *v;
}

double CliArgs::get_double(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  if (auto v = parse_double(it->second)) return *v;
  VQDDP_THROW("{}: --{} expects a number, got '{}'", command_, name, it->second);
}

void CliArgs::expect_positional(size_t n, const std::string& what) const {
  VQDDP_CHECK(positional_.size() == n, "{}: expected {} ({} argument{}), got {}", command_, what, n, n == 1 ? "" : "s",
              positional_.size());
}

}  // namespace vqddp
