// A value a user gave (a path, a key, a line) as an error message shows it:
// whole when short, else its first and last kShownEnd bytes around "…",
// so a 1 MB path from a list still makes a readable line. Beside
// engine/core/error.h (whose every includer would be rebuilt by a change)
// for any message that echoes user text.
// Internal header: not installed with the library (messages are built inside it).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace vqddp {

inline constexpr size_t kShownMax = 240, kShownEnd = 100;

// Cut between UTF-8 characters, never inside one.
inline std::string shown(std::string_view text) {
  if (text.size() <= kShownMax) return std::string(text);
  auto continuation = [&](size_t i) { return (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80; };
  size_t head = kShownEnd, tail = text.size() - kShownEnd;
  while (head > 0 && continuation(head)) --head;
  while (tail < text.size() && continuation(tail)) ++tail;
  std::string out(text.substr(0, head));
  out += "…";
  out += text.substr(tail);
  return out;
}

}  // namespace vqddp
