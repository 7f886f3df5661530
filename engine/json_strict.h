// JSON text as users write it, read strictly: comments are allowed (configs
// carry notes), a key given twice in one object is an error naming the key
// and its line (nlohmann keeps the last one silently, so a config that sets
// "lr" twice would train with whichever came last), and a syntax error names
// `origin`.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace vqddp {

nlohmann::json parse_json_strict(const std::string& text, const std::string& origin);

}  // namespace vqddp
