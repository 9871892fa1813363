// CPU reference of the activation family (activation.h): plain loops in fp64.
#pragma once

#include "megatron/tensor/tensor.h"

namespace megatron::ops::cpu {

enum class Pointwise { Gelu, Silu };

void pointwise_forward(Pointwise op, const Tensor& y, const Tensor& x);
void pointwise_backward(Pointwise op, const Tensor& dx, const Tensor& dy, const Tensor& x);
void swiglu_forward(const Tensor& y, const Tensor& x);
void swiglu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x);

}  // namespace megatron::ops::cpu
