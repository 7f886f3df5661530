// Checked CUDA and cuBLAS calls: a failure becomes a vqddp::Error carrying
// file, line, the call and the library's own message. Usable from g++ and
// nvcc translation units (no fmt here; the formatting happens in
// cuda_check.cpp).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

namespace vqddp {
[[noreturn]] void cuda_fail(const char* file, int line, const char* call, int code, const char* what);
}

#define VQDDP_CUDA_CHECK(expr)                                                                       \
  do {                                                                                               \
    cudaError_t vqddp_err_ = (expr);                                                                 \
    if (vqddp_err_ != cudaSuccess)                                                                   \
      ::vqddp::cuda_fail(__FILE__, __LINE__, #expr, static_cast<int>(vqddp_err_), cudaGetErrorString(vqddp_err_)); \
  } while (0)

#define VQDDP_CUBLAS_CHECK(expr)                                                                       \
  do {                                                                                                 \
    cublasStatus_t vqddp_st_ = (expr);                                                                 \
    if (vqddp_st_ != CUBLAS_STATUS_SUCCESS)                                                            \
      ::vqddp::cuda_fail(__FILE__, __LINE__, #expr, static_cast<int>(vqddp_st_), cublasGetStatusString(vqddp_st_)); \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, at the
// launch site, instead of at some later unrelated call.
#define VQDDP_CUDA_CHECK_LAUNCH() VQDDP_CUDA_CHECK(cudaGetLastError())
