// The per-context CUDA library state: device properties, the stream, cuBLASLt and cuDNN handles, the
// cuBLASLt workspace and a plan cache where ops keep what is expensive to build (cuDNN graphs, cuBLASLt
// algorithm choices), keyed by a string that names the op and its shapes. CUDA builds only.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <memory>
#include <string>
#include <unordered_map>

#include "megatron/runtime/cuda_stream.h"
#include "megatron/tensor/tensor.h"

namespace megatron {

struct CudaLibraries {
  CudaLibraries(int device_index, Allocator& allocator);
  ~CudaLibraries();
  CudaLibraries(const CudaLibraries&) = delete;
  CudaLibraries& operator=(const CudaLibraries&) = delete;

  int device_index;
  cudaDeviceProp properties{};
  CudaStream stream;
  cublasLtHandle_t cublaslt = nullptr;
  cudnnHandle_t cudnn = nullptr;
  static constexpr size_t kCublasLtWorkspaceBytes = 64ull << 20;
  Tensor cublaslt_workspace;

  // Type-erased cache; ops store shared_ptr<TheirPlan> and cast back with get_plan<T>.
  std::unordered_map<std::string, std::shared_ptr<void>> plans;
  template <class T>
  T* get_plan(const std::string& key) {
    auto it = plans.find(key);
    return it == plans.end() ? nullptr : static_cast<T*>(it->second.get());
  }
  template <class T>
  T* put_plan(const std::string& key, std::shared_ptr<T> plan) {
    T* raw = plan.get();
    plans[key] = std::move(plan);
    return raw;
  }
};

}  // namespace megatron
