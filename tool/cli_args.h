// Command-line arguments of one subcommand: positionals and --name value
// options, every option declared up front so a typo is an error naming it.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/core/count_limits.h"
#include "engine/core/parse_number.h"

namespace vqddp {

// The ranges of the flags' own counts (engine/core/count_limits.h; flags that
// set a config key take the key's range, train/config.h).
namespace limits {
inline constexpr CountRange demo_steps{1, 100000000};
inline constexpr CountRange chunk_frames{1, int64_t{1} << 20};  // encode/decode --chunk (model frames)
inline constexpr CountRange packet_frames{1, 255};              // encode --stream --packet-frames
}  // namespace limits

class CliArgs {
 public:
  // argv[first..argc) of `command`; `options` are the names (without "--")
  // that take a value, `switches` those that take none (has() tells).
  CliArgs(const std::string& command, int argc, char** argv, int first, const std::set<std::string>& options,
          const std::set<std::string>& switches = {});

  const std::vector<std::string>& positional() const { return positional_; }
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string get(const std::string& name, const std::string& fallback) const;
  // A 64-bit integer within `range` (engine/core/count_limits.h), else an error naming
  // the flag and the range.
  int64_t get_int(const std::string& name, int64_t fallback, CountRange range) const;
  double get_double(const std::string& name, double fallback) const;
  // Exactly `n` positionals, or an error naming `what` they should be.
  void expect_positional(size_t n, const std::string& what) const;

 private:
  std::string command_;
  std::vector<std::string> positional_;
  std::map<std::string, std::string> values_;
};

}  // namespace vqddp
