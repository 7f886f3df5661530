// Strict reading of a JSON config: every value is looked up by key path,
// type-checked, and every key a section holds must be one the code reads.
// Errors name the file, the key path and the expected type, e.g.
//   run.json: 'optimizer.lr' must be a number, got string "fast"
//   run.json: unknown key 'quantizer.decy' (known here: codebook_size, decay, ...)
#pragma once

#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <vector>

#include "engine/core/parse_number.h"

namespace vqddp {

class ConfigSection {
 public:
  // `obj` must outlive the section. `path` is the dotted path of `obj`
  // ("" for the root).
  ConfigSection(const nlohmann::json& obj, std::string path, std::string file);

  double number(const std::string& key, double fallback);
  // An integer within `range` (engine/core/count_limits.h), else an error naming the key
  // and the range; values beyond int64 (JSON allows them) are refused the
  // same way instead of wrapping around.
  int64_t integer(const std::string& key, int64_t fallback, CountRange range);
  // The full 64-bit unsigned range (seeds).
  uint64_t unsigned_integer(const std::string& key, uint64_t fallback);
  bool boolean(const std::string& key, bool fallback);
  std::string string(const std::string& key, const std::string& fallback);
  // One of `choices`, else an error listing them.
  std::string choice(const std::string& key, const std::string& fallback, const std::vector<std::string>& choices);
  std::vector<int64_t> integers(const std::string& key, const std::vector<int64_t>& fallback, CountRange range);
  std::vector<double> numbers(const std::string& key, const std::vector<double>& fallback);
  // Whether the section holds `key` (not counted as reading it).
  bool has(const std::string& key) const;
  // A sub-object; an absent key gives an empty section.
  ConfigSection section(const std::string& key);
  // Elements of an array of objects.
  std::vector<ConfigSection> sections(const std::string& key);
  // Throws for any key of this section that was never read; `context`
  // ("for type \"fsq\"") says why the keys known here are the ones they are.
  void finish(const std::string& context = "") const;

  // Refuses `key` when the product of `factors` (what `formula` names, e.g.
  // "codebook_size x codebook_dim") overflows or exceeds the elements one
  // tensor may hold: sizes are refused by key before anything is allocated,
  // where the allocator would say only std::bad_alloc.
  void check_elements(const std::string& key, const std::string& formula, const std::vector<int64_t>& factors) const;

  std::string key_path(const std::string& key) const;
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;

 private:
  const nlohmann::json* get(const std::string& key);
  int64_t checked_integer(const std::string& key, const nlohmann::json& v, CountRange range) const;

  const nlohmann::json& obj_;
  std::string path_, file_;
  std::set<std::string> read_;
};

}  // namespace vqddp
