// Fixtures for tests that damage files on purpose: where a tensor's bytes
// sit in a safetensors file, and a pid that names no process (the owner of
// a temporary file left by a killed save).
#pragma once

#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

namespace vqddp::test {

// The byte offset of the data in the safetensors file `bytes`, and tensor
// `name`'s byte range relative to it ([0, 0) for a name not in the header).
struct SafetensorsLayout {
  size_t data_start = 0, begin = 0, end = 0;
};
inline SafetensorsLayout safetensors_layout(const std::string& bytes, const std::string& name = "") {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  SafetensorsLayout out{8 + n, 0, 0};
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  if (header.contains(name)) {
    out.begin = header[name]["data_offsets"][0].get<size_t>();
    out.end = header[name]["data_offsets"][1].get<size_t>();
  }
  return out;
}

// A pid that named a process a moment ago and names none now.
inline pid_t dead_pid() {
  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  REQUIRE(child > 0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;
}

}  // namespace vqddp::test
