// Errors: every fallible call ends in an exception that says what and why.
//
// The library never calls exit(): a rank thread that fails must be able to
// throw into the thread-group machinery (comm/) so the other ranks are woken
// instead of hanging.
//
// Two kinds of check. VQDDP_CHECK refuses what a user gave (a file, a key, a
// shape, a call of the library's API): its message speaks to that user and
// names what was wrong, so what() is the message alone; the source position
// rides along in where() for a developer (printed by the vqddp tool with
// VQDDP_ERROR_POSITIONS=1). VQDDP_ASSERT guards our own invariants, which no
// input can break: its failure is a bug in vqddp, and its message says so
// with the position ("internal error at engine/autograd.cpp:144: ...").
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace vqddp {

// Base class of every error the library throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  Error(const std::string& message, std::string where) : std::runtime_error(message), where_(std::move(where)) {}
  // "file:line" of the check that threw, from the source root down ("" when
  // the error was built without one).
  const std::string& where() const { return where_; }

 private:
  std::string where_;
};

// A value that must be finite is not (a diverging model, NaN weights): its
// own type, so the training loop can say where the value came from (the
// data, or the model at which step) instead of only where it was found.
class NonFiniteError : public Error {
 public:
  using Error::Error;
};

// "file:line" with the file shown from the source root down, stable across
// build directories.
std::string source_position(const char* file, int line);
[[noreturn]] void throw_error(const char* file, int line, const std::string& message);
[[noreturn]] void throw_internal_error(const char* file, int line, const std::string& message);

}  // namespace vqddp

// Throws vqddp::Error(message) with a fmt-formatted message.
#define VQDDP_THROW(...) ::vqddp::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__))

#define VQDDP_THROW_NONFINITE(...) \
  throw ::vqddp::NonFiniteError(::fmt::format(__VA_ARGS__), ::vqddp::source_position(__FILE__, __LINE__))

// Throws when `cond` is false; the message arguments are only formatted then.
#define VQDDP_CHECK(cond, ...)        \
  do {                                \
    if (!(cond)) VQDDP_THROW(__VA_ARGS__); \
  } while (0)

// An invariant of vqddp's own code: failing it is a bug, reported with the
// source position.
#define VQDDP_ASSERT(cond, ...)                                                              \
  do {                                                                                       \
    if (!(cond)) ::vqddp::throw_internal_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
  } while (0)
