// CUDA kernel of fp8_block_quantize (see fp8_block.h), queued on ctx's stream. Arguments are validated by
// the caller; either output pair may be undefined (not wanted).
#pragma once

#include "megatron/ops/gemm/gemm.h"
#include "megatron/runtime/context.h"

namespace megatron::ops::cuda {

void fp8_block_quantize(Context& ctx, const Tensor& q, const Tensor& q_scale_inv, const Tensor& q_t,
                        const Tensor& q_t_scale_inv, const Tensor& in, Fp8ScaleLayout layout);

}  // namespace megatron::ops::cuda
