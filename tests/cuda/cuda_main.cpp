// Entry point of the GPU test suite. Without a CUDA device (or in a build
// without CUDA) it exits with 77, which meson reports as SKIP: the suite
// never fails, and never passes silently, on a machine without a GPU.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "engine/device.h"

int main(int argc, char** argv) {
  if (vqddp::cuda_device_count() == 0) {
    std::printf("GPU tests skipped: %s\n", vqddp::cuda_built() ? "no CUDA device on this machine"
                                                               : "this build has no CUDA support");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
