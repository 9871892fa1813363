// CPU reference kernels of the optimizer family (parallel blocks, double math). Arguments are validated by the
// caller (optimizer.cpp).
#pragma once

#include <vector>

#include "megatron/ops/optimizer/optimizer.h"

namespace megatron::ops::cpu {

void adamw_step(const std::vector<AdamParamGroupTensors>& tensors, const AdamWConfig& config);
void multi_tensor_l2_norm(const Tensor& out, const Tensor& per_tensor_out, const std::vector<Tensor>& tensors);
void multi_tensor_count_zeros(const Tensor& out, const std::vector<Tensor>& tensors);
void multi_tensor_scale(const std::vector<Tensor>& outs, const Tensor& found_inf, const std::vector<Tensor>& ins,
                        float scale);

}  // namespace megatron::ops::cpu
