// CUDA kernels of the cross_entropy family (launched on ctx.stream()). Arguments are validated by the
// caller (cross_entropy.cpp). No CUDA types here.
#pragma once

#include "megatron/runtime/context.h"

namespace megatron::ops::cuda {

void cross_entropy_forward(Context& ctx, const Tensor& losses, const Tensor& lse, const Tensor& logits,
                           const Tensor& targets);
void cross_entropy_backward(Context& ctx, const Tensor& dlogits, const Tensor& dlosses, const Tensor& logits,
                            const Tensor& targets, const Tensor& lse);
void cross_entropy_forward_backward(Context& ctx, const Tensor& losses, const Tensor& lse, const Tensor& dlogits,
                                    const Tensor& dlosses, const Tensor& logits, const Tensor& targets);
void masked_mean_loss(Context& ctx, const Tensor& out, const Tensor& losses, const Tensor& loss_mask);
void masked_mean_loss_grad(Context& ctx, const Tensor& dlosses, const Tensor& loss_mask, double denominator);

}  // namespace megatron::ops::cuda
