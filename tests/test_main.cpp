// doctest entry point shared by every test executable. It picks the fast
// BLAS core first, exactly as the vqddp executable does, so tests exercise
// what users run.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "engine/blas.h"

int main(int argc, char** argv) {
  vqddp::blas_prefer_fast_core(argv);
  doctest::Context context(argc, argv);
  return context.run();
}
