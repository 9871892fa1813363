// CUDA kernels of the cross_entropy family (launched on ctx.stream()). Arguments are validated by the
// caller (cross_entropy.cpp). No CUDA types here.
#pragma once

#include <cstdint>

#include "megatron/runtime/context.h"

namespace megatron::ops::cuda {

void cross_entropy_forward(Context& ctx, const Tensor& losses, const Tensor& lse, const Tensor& logits,
                           const Tensor& targets);
void cross_entropy_backward(Context& ctx, const Tensor& dlogits, const Tensor& dlosses, const Tensor& logits,
                            const Tensor& targets, const Tensor& lse);
void cross_entropy_forward_backward(Context& ctx, const Tensor& losses, const Tensor& lse, const Tensor& dlogits,
                                    const Tensor& dlosses, const Tensor& logits, const Tensor& targets);
void vocab_parallel_cross_entropy_stats(Context& ctx, const Tensor& stats, const Tensor& logits, const Tensor& targets,
                                        int64_t vocab_start, int64_t global_vocab);
void vocab_parallel_cross_entropy_combine(Context& ctx, const Tensor& losses, const Tensor& lse, const Tensor& stats);
void vocab_parallel_cross_entropy_backward(Context& ctx, const Tensor& dlogits, const Tensor& dlosses,
                                           const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                           int64_t vocab_start, int64_t global_vocab);
void masked_mean_loss(Context& ctx, const Tensor& out, const Tensor& losses, const Tensor& loss_mask);
void masked_mean_loss_grad(Context& ctx, const Tensor& dlosses, const Tensor& loss_mask, double denominator);

}  // namespace megatron::ops::cuda
