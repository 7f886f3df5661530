#include "engine/core/json_strict.h"

#include <iterator>
#include <set>
#include <vector>

#include "engine/core/error.h"

namespace vqddp {

namespace {

// A character iterator that counts the newlines the parser has consumed, so
// the parse callback knows the line of the key it was just given (the lexer
// has read up to the key's closing quote when the callback runs).
class LineCountingIterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  LineCountingIterator(const char* p, int64_t* line) : p_(p), line_(line) {}
  reference operator*() const { return *p_; }
  LineCountingIterator& operator++() {
    if (*p_ == '\n') ++*line_;
    ++p_;
    return *this;
  }
  LineCountingIterator operator++(int) {
    LineCountingIterator old = *this;
    ++*this;
    return old;
  }
  bool operator==(const LineCountingIterator& o) const { return p_ == o.p_; }
  bool operator!=(const LineCountingIterator& o) const { return p_ != o.p_; }

 private:
  const char* p_;
  int64_t* line_;
};

}  // namespace

nlohmann::json parse_json_strict(const std::string& text, const std::string& origin) {
  int64_t line = 1;
  std::vector<std::set<std::string>> keys;  // one set per open object
  auto callback = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if ((event == E::object_start || event == E::array_start) && depth >= kMaxJsonDepth)
      VQDDP_THROW("{}: line {}: nesting deeper than {} objects and arrays, the most vqddp reads", origin, line,
                  kMaxJsonDepth);
    if (event == E::object_start) keys.emplace_back();
    if (event == E::object_end) keys.pop_back();
    if (event == E::key && !keys.back().insert(parsed.get<std::string>()).second)
      VQDDP_THROW("{}: line {}: key \"{}\" appears twice in one object (the first would be ignored)", origin, line,
                  parsed.get<std::string>());
    return true;
  };
  try {
    return nlohmann::json::parse(LineCountingIterator(text.data(), &line),
                                 LineCountingIterator(text.data() + text.size(), &line), callback,
                                 /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const nlohmann::json::exception& e) {
    VQDDP_THROW("{}: not valid JSON: {}", origin, e.what());
  }
}

}  // namespace vqddp
