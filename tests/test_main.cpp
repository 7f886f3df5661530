// doctest entry point shared by every test executable. It picks the fast
// BLAS core first, exactly as the vqddp executable does, so tests exercise
// what users run. The audio header index (data/audio_index.h) goes to a
// test cache (tests/meson.build's VQDDP_TEST_CACHE, else one in /tmp), never
// the user's ~/.cache, however the executable is started.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "engine/cpu/blas.h"

int main(int argc, char** argv) {
  const char* cache = std::getenv("VQDDP_TEST_CACHE");
  const std::string dir = cache && *cache ? cache : "/tmp/vqddp-test-cache-" + std::to_string(::getuid());
  ::setenv("XDG_CACHE_HOME", dir.c_str(), 1);
  vqddp::blas_prefer_fast_core(argv);
  doctest::Context context(argc, argv);
  return context.run();
}
