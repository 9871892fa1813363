// CUDA kernels of the activation family (activation.h); arguments already validated.
#pragma once

#include "megatron/ops/activation/cpu.h"  // Pointwise
#include "megatron/runtime/context.h"

namespace megatron::ops::cuda {

using cpu::Pointwise;

void pointwise_forward(Context& ctx, Pointwise op, const Tensor& y, const Tensor& x);
void pointwise_backward(Context& ctx, Pointwise op, const Tensor& dx, const Tensor& dy, const Tensor& x);
void swiglu_forward(Context& ctx, const Tensor& y, const Tensor& x);
void swiglu_backward(Context& ctx, const Tensor& dx, const Tensor& dy, const Tensor& x);

}  // namespace megatron::ops::cuda
