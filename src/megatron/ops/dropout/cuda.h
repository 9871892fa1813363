// CUDA kernels of the dropout family (dropout.h); arguments already validated. `bias`, `residual` may be
// undefined.
#pragma once

#include <cstdint>

#include "megatron/runtime/context.h"

namespace megatron::ops::cuda {

void dropout(Context& ctx, const Tensor& y, const Tensor& x, const Tensor& bias, const Tensor& residual, float p,
             uint64_t seed, uint64_t offset, uint64_t index_base);

}  // namespace megatron::ops::cuda
