#include "engine/cuda/cuda_check.h"

#include "engine/core/error.h"

namespace vqddp {

void cuda_fail(const char* file, int line, const char* call, int code, const char* what) {
  throw_error(file, line, fmt::format("CUDA call failed: {} -> error {} ({})", call, code, what));
}

}  // namespace vqddp
