// Timing cuBLAS / cuBLASLt algorithm candidates when a GEMM plan is built (ops/gemm and ops/grouped_gemm).
// CUDA builds only.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime.h>

#include "megatron/core/cuda_check.h"

namespace megatron::ops::cuda {

// The index of the fastest of `count` candidates, where launch(i) enqueues candidate i on `stream` and returns
// its cuBLAS status: each is launched once (the warm-up; a candidate whose launch fails is skipped) and then
// three times between two events. -1 when no candidate launches. Synchronises the stream: for plan building
// only, never on the hot path.
template <class Launch>
int fastest_launch(cudaStream_t stream, int count, Launch&& launch) {
  cudaEvent_t start = nullptr, stop = nullptr;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  int best = -1;
  float best_ms = 0;
  for (int i = 0; i < count; ++i) {
    if (launch(i) != CUBLAS_STATUS_SUCCESS) continue;
    CUDA_CHECK(cudaEventRecord(start, stream));
    constexpr int kRepeats = 3;
    for (int r = 0; r < kRepeats; ++r) launch(i);
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (best < 0 || ms < best_ms) best = i, best_ms = ms;
  }
  (void)cudaGetLastError();  // a failed candidate's launch error is not the caller's
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

}  // namespace megatron::ops::cuda
