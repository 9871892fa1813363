// CPU reference of the dropout family (dropout.h). `bias` and `residual` may be undefined.
#pragma once

#include <cstdint>

#include "megatron/tensor/tensor.h"

namespace megatron::ops::cpu {

// y = [residual +] (keep ? (x [+ bias]) * scale : 0).
void dropout(const Tensor& y, const Tensor& x, const Tensor& bias, const Tensor& residual, float p, uint64_t seed,
             uint64_t offset, uint64_t index_base);

}  // namespace megatron::ops::cpu
