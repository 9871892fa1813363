// Status checks for the CUDA runtime, cuBLAS(Lt) and cuDNN. Each failure throws megatron::Error naming the
// library, the status, and the call as written (with its argument expressions); callers that know more
// (sizes, shapes) add it with the _MSG variants. Include only from CUDA-enabled translation units.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "megatron/core/error.h"

namespace megatron::detail {
const char* cublas_status_name(cublasStatus_t status);
}  // namespace megatron::detail

#define MEGATRON_STATUS_FAIL_(lib, call, status_text, extra)                                              \
  ::megatron::detail::fail_check(nullptr,                                                                  \
                                 ::megatron::str_cat(lib, " call failed with ", status_text, ": ", call, \
                                                     extra),                                               \
                                 std::source_location::current())

#define CUDA_CHECK_MSG(call, ...)                                                                          \
  do {                                                                                                     \
    cudaError_t status_ = (call);                                                                          \
    if (status_ != cudaSuccess) [[unlikely]]                                                               \
      MEGATRON_STATUS_FAIL_("CUDA", #call,                                                                 \
                            ::megatron::str_cat(cudaGetErrorName(status_), " (", cudaGetErrorString(status_), ")"), \
                            ::megatron::str_cat(__VA_ARGS__));                                             \
  } while (0)
#define CUDA_CHECK(call) CUDA_CHECK_MSG(call, "")

// After a kernel launch: launch-configuration errors surface here, with the kernel's name.
#define CUDA_CHECK_LAUNCH(kernel_name) CUDA_CHECK_MSG(cudaGetLastError(), " after launching ", kernel_name)

#define CUBLAS_CHECK_MSG(call, ...)                                                                        \
  do {                                                                                                     \
    cublasStatus_t status_ = (call);                                                                       \
    if (status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                                     \
      MEGATRON_STATUS_FAIL_("cuBLAS", #call, ::megatron::detail::cublas_status_name(status_),              \
                            ::megatron::str_cat(__VA_ARGS__));                                             \
  } while (0)
#define CUBLAS_CHECK(call) CUBLAS_CHECK_MSG(call, "")

#define CUDNN_CHECK_MSG(call, ...)                                                                         \
  do {                                                                                                     \
    cudnnStatus_t status_ = (call);                                                                        \
    if (status_ != CUDNN_STATUS_SUCCESS) [[unlikely]]                                                      \
      MEGATRON_STATUS_FAIL_("cuDNN", #call, cudnnGetErrorString(status_), ::megatron::str_cat(__VA_ARGS__)); \
  } while (0)
#define CUDNN_CHECK(call) CUDNN_CHECK_MSG(call, "")
