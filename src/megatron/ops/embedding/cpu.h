// CPU reference kernels of the embedding family (plain loops, double accumulation). Shapes and dtypes are
// validated by the caller (embedding.cpp); id values are validated here.
#pragma once

#include "megatron/tensor/tensor.h"

namespace megatron::ops::cpu {

void embedding_forward(const Tensor& out, const Tensor& weight, const Tensor& ids);
void embedding_backward(const Tensor& dweight, const Tensor& dout, const Tensor& ids, bool accumulate);

}  // namespace megatron::ops::cpu
