#include "engine/core/json_strict.h"

#include <algorithm>
#include <iterator>
#include <set>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/shown.h"

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

// Records where a text stops being JSON, building nothing.
struct SyntaxErrorFinder : nlohmann::json_sax<nlohmann::json> {
  size_t byte = 0;     // 1-based: the character reading stopped at
  std::string reason;  // nlohmann's message
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(size_t at, const std::string&, const nlohmann::detail::exception& e) override {
    byte = at;
    reason = e.what();
    return false;
  }
};

// "line 3, column 7: unexpected '}'; expected ','" (a text of one line:
// "column 7: ..."), from nlohmann's "[json.exception.parse_error.101]
// parse error at line 3, column 7: syntax error while parsing object
// separator - unexpected '}'; expected ','", which names neither the file
// nor the problem in a user's words.
std::string syntax_error_place(const std::string& text) {
  SyntaxErrorFinder finder;
  if (nlohmann::json::sax_parse(text, &finder, nlohmann::json::input_format_t::json, /*strict=*/true,
                                /*ignore_comments=*/true))
    return "";
  const size_t at = std::min(finder.byte > 0 ? finder.byte - 1 : 0, text.size());
  const size_t line_start = text.rfind('\n', at == 0 ? 0 : at - 1);
  const size_t column = line_start == std::string::npos || at == 0 ? at + 1 : at - line_start;
  const size_t dash = finder.reason.find(" - ");
  const std::string why = dash == std::string::npos ? "the text is not JSON" : shown(finder.reason.substr(dash + 3));
  if (text.find('\n') == std::string::npos) return fmt::format("column {}: {}", column, why);
  const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n');
  return fmt::format("line {}, column {}: {}", line, column, why);
}

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
    const std::string place = syntax_error_place(text);
    VQDDP_CHECK(place.empty(), "{}: not valid JSON at {}", origin, place);
    VQDDP_THROW("{}: not valid JSON: {}", origin, e.what());  // not a syntax error: none known, but say it
  }
}

}  // namespace vqddp
