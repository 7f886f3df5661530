// Lines for the person running vqddp: progress on stdout, warnings on
// stderr. Each is flushed as printed (on a file or a pipe, `vqddp train >
// log` or `| tee`, the streams are block-buffered and lines would come
// minutes late, or not before a kill), and none can stop a run: a full disk
// or a closed pipe under the output loses the line, never the training (a
// throw from a destructor's warning ended the process with SIGABRT).
// Internal header: not installed with the library.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <utility>

namespace vqddp {

template <typename... Args>
void console_line(std::FILE* to, fmt::format_string<Args...> format, Args&&... args) noexcept {
  try {
    fmt::print(to, format, std::forward<Args>(args)...);
    std::fflush(to);
  } catch (...) {  // the stream failed: the line is lost, the run goes on
  }
}

// A progress line on stdout.
template <typename... Args>
void progress(fmt::format_string<Args...> format, Args&&... args) noexcept {
  console_line(stdout, format, std::forward<Args>(args)...);
}

}  // namespace vqddp
