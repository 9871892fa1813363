// One expert's GEMM in cuBLAS's column-major terms, shared by the grouped-GEMM CUDA sources (cuda.cu builds
// the problems; cuda_lt.cu runs them one by one on cuBLASLt). CUDA builds only.
//   C (m x n) = beta * C + op(A) op(B), A m x k (ta = N, leading dimension lda) or k x m (T), B likewise k x n
//   or n x k; A and B in `Types::in`, C in `Types::out`, fp32 compute.
#pragma once

#include <cublas_v2.h>

#include <cstdint>

#include "megatron/runtime/context.h"

namespace megatron::ops::cuda::grouped {

struct Problem {
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  float beta = 0.0f;
  bool rows_in_k = false;  // the expert's row count is k (a weight gradient), else n (forward, input gradient)
};

struct Types {
  cudaDataType_t in, out;
};

// Runs `p` with cuBLASLt, with an algorithm chosen once per shape family (see cuda_lt.cu); false when
// cuBLASLt has no algorithm for it or declines this problem (nothing was launched: the caller runs it
// another way).
bool run_with_cublaslt(Context& ctx, const Problem& p, Types t);

}  // namespace megatron::ops::cuda::grouped
