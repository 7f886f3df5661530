#include "tool/cli_args.h"

#include <fmt/format.h>

#include "engine/core/error.h"
#include "engine/core/parse_number.h"

namespace vqddp {

CliArgs::CliArgs(const std::string& command, int argc, char** argv, int first, const std::set<std::string>& options,
                 const std::set<std::string>& switches)
    : command_(command) {
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) {
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    if (switches.count(name)) {
      values_[name] = "";
      continue;
    }
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else {
      VQDDP_CHECK(options.count(name) == 0 || i + 1 < argc, "{}: option --{} needs a value", command, name);
      if (options.count(name)) value = argv[++i];
    }
    if (!options.count(name)) {
      std::set<std::string> known = options;
      known.insert(switches.begin(), switches.end());
      VQDDP_THROW("{}: unknown option --{} (known: {})", command, name,
                  known.empty() ? std::string("none") : fmt::format("--{}", fmt::join(known, ", --")));
    }
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
  return parse_count(it->second, range, fmt::format("{}: --{}", command_, name));
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
