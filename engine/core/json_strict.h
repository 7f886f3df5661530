// JSON text as users write it, read strictly: comments are allowed (configs
// carry notes), a key given twice in one object is an error naming the key
// and its line (nlohmann keeps the last one silently, so a config that sets
// "lr" twice would train with whichever came last), nesting is bounded
// (kMaxJsonDepth), and a syntax error names `origin`.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace vqddp {

// Objects and arrays nested deeper are an error naming `origin` and the
// line: the parsed tree is walked recursively (ours and nlohmann's), so
// 200,000 brackets would overflow the stack. Configs nest 3 deep.
inline constexpr int kMaxJsonDepth = 64;

nlohmann::json parse_json_strict(const std::string& text, const std::string& origin);

}  // namespace vqddp
