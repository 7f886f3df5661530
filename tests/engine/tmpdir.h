// A fresh scratch directory per test, removed afterwards.
#pragma once

#include <filesystem>
#include <string>

#include <unistd.h>

namespace vqddp::test {

class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    const char* base = std::getenv("VQDDP_TEST_TMP");
    path_ = std::filesystem::path(base ? base : std::filesystem::temp_directory_path().string()) /
            ("vqddp-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace vqddp::test
