// CPU reference of fp8_block_quantize (see fp8_block.h). Arguments are validated by the caller; either
// output pair may be undefined (not wanted).
#pragma once

#include "megatron/ops/gemm/gemm.h"
#include "megatron/tensor/tensor.h"

namespace megatron::ops::cpu {

void fp8_block_quantize(const Tensor& q, const Tensor& q_scale_inv, const Tensor& q_t, const Tensor& q_t_scale_inv,
                        const Tensor& in, Fp8ScaleLayout layout);

}  // namespace megatron::ops::cpu
