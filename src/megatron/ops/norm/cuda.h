// CUDA kernels of the norm family (norm.h); arguments as in cpu.h, already validated by norm.cpp.
#pragma once

#include "megatron/runtime/context.h"

namespace megatron::ops::cuda {

void norm_forward(Context& ctx, bool rms, const Tensor& y, const Tensor& residual_out, const Tensor& mean,
                  const Tensor& rstd, const Tensor& x, const Tensor& residual, const Tensor& weight,
                  const Tensor& bias, float eps);

void norm_backward(Context& ctx, bool rms, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                   const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                   bool accumulate_weight_grads, const Tensor& dresidual);

}  // namespace megatron::ops::cuda
