// CUDA kernels of the optimizer family (launched on ctx.stream()); arguments validated by optimizer.cpp.
// No CUDA types here.
#pragma once

#include <vector>

#include "megatron/ops/optimizer/optimizer.h"

namespace megatron::ops::cuda {

void adamw_step(Context& ctx, const std::vector<AdamParamGroupTensors>& tensors, const AdamWConfig& config);
void multi_tensor_l2_norm(Context& ctx, const Tensor& out, const Tensor& per_tensor_out,
                          const std::vector<Tensor>& tensors);
void multi_tensor_count_zeros(Context& ctx, const Tensor& out, const std::vector<Tensor>& tensors);
void multi_tensor_scale(Context& ctx, const std::vector<Tensor>& outs, const Tensor& found_inf,
                        const std::vector<Tensor>& ins, float scale);

}  // namespace megatron::ops::cuda
