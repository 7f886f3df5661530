// A value a user gave (a path, a key, a line) as an error message shows it:
// whole when short, else its first and last kShownEnd bytes around "…",
// so a 1 MB path from a list still makes a readable line, and its control
// characters (a NUL, an ESC that would recolour a terminal, a newline that
// would fake a second message) as \xNN. Beside
// engine/core/error.h (whose every includer would be rebuilt by a change)
// for any message that echoes user text.
// Internal header: not installed with the library (messages are built inside it).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace vqddp {

inline constexpr size_t kShownMax = 240, kShownEnd = 100;

// `text` with each control character written \xNN.
inline std::string escaped_controls(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u != 0x7f) {
      out += c;
      continue;
    }
    constexpr char kHex[] = "0123456789abcdef";
    out += "\\x";
    out += kHex[u >> 4];
    out += kHex[u & 15];
  }
  return out;
}

// Cut between UTF-8 characters, never inside one.
inline std::string shown(std::string_view text) {
  if (text.size() <= kShownMax) return escaped_controls(text);
  auto continuation = [&](size_t i) { return (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80; };
  size_t head = kShownEnd, tail = text.size() - kShownEnd;
  while (head > 0 && continuation(head)) --head;
  while (tail < text.size() && continuation(tail)) ++tail;
  std::string out = escaped_controls(text.substr(0, head));
  out += "…";
  out += escaped_controls(text.substr(tail));
  return out;
}

}  // namespace vqddp
