// Errors: every fallible call ends in an exception that says where and why.
//
// The library never calls exit(): a rank thread that fails must be able to
// throw into the thread-group machinery (comm/) so the other ranks are woken
// instead of hanging. VQDDP_CHECK captures file and line so a message read
// in a log from 8 ranks still points at the code that refused the input.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace vqddp {

// Base class of every error the library throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A value that must be finite is not (a diverging model, NaN weights): its
// own type, so the training loop can say where the value came from (the
// data, or the model at which step) instead of only where it was found.
class NonFiniteError : public Error {
 public:
  using Error::Error;
};

// "file:line: message", the file shown from the source root down.
std::string error_text(const char* file, int line, const std::string& message);
[[noreturn]] void throw_error(const char* file, int line, const std::string& message);

}  // namespace vqddp

// Throws vqddp::Error("file:line: message") with a fmt-formatted message.
#define VQDDP_THROW(...) ::vqddp::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__))

#define VQDDP_THROW_NONFINITE(...) \
  throw ::vqddp::NonFiniteError(::vqddp::error_text(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__)))

// Throws when `cond` is false; the message arguments are only formatted then.
#define VQDDP_CHECK(cond, ...)        \
  do {                                \
    if (!(cond)) VQDDP_THROW(__VA_ARGS__); \
  } while (0)
