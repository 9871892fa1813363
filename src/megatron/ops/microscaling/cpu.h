// CPU kernels of the microscaling family (see microscaling.h). Arguments are validated by the caller.
// Rows never matter: cols is a multiple of 32, so the tensors are one flat run of 32-element blocks, block
// b holding elements [32 b, 32 b + 32), scale b and code bytes [32 b, 32 b + 32) (E2M1: [16 b, 16 b + 16)).
#pragma once

#include "megatron/ops/microscaling/formats.h"
#include "megatron/tensor/tensor.h"

namespace megatron::ops::cpu {

void mx_quantize(const Tensor& codes, const Tensor& scales, const Tensor& in, MxElement element);
void mx_dequantize(const Tensor& out, const Tensor& codes, const Tensor& scales, MxElement element);

}  // namespace megatron::ops::cpu
