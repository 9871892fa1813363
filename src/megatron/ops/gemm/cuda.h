// CUDA implementation of the gemm family: cuBLASLt (see gemm.h for the contract). No CUDA types here.
#pragma once

#include "megatron/ops/gemm/dims.h"
#include "megatron/ops/gemm/gemm.h"

namespace megatron::ops::cuda {

// Arguments already validated by ops::gemm.
void gemm(Context& ctx, const Tensor& d, const Tensor& a, const Tensor& b, const GemmOptions& opt, const GemmDims& g);

}  // namespace megatron::ops::cuda
