// Vocabulary-parallel cross-entropy (Megatron's tensor_parallel/cross_entropy.py) that never gathers the logits:
// each TP rank holds logits [T, V / TP] of the vocabulary entries [vocab_start, vocab_start + V / TP) (the
// column-parallel output layer's shard). Forward: every rank computes, per token, the max, the sum of
// exp(x - max) and the target's logit (0 when the target is another rank's) over its shard; these [3, T]
// statistics (not the [T, V / TP] logits) are all-gathered over TP and combined in rank order, so every rank
// gets the same losses and log-sum-exps bit for bit. (Megatron all-reduces the max, then the sum-exp and the
// target logit; one all-gather of the three carries the same information in one collective.) Backward needs
// no communication: dlogits = dlosses * (softmax - one-hot of the targets that fall in this shard).
// At TP = 1 they are ops::cross_entropy_forward / backward (or the one-pass forward_backward).
//
// Shapes as ops/cross_entropy/cross_entropy.h: losses, lse, dlosses [T] F32 (F64 on the CPU for F64 logits);
// targets [T] global ids in [0, global_vocab); dlogits may be logits itself (in place).
#pragma once

#include <cstdint>

#include "megatron/parallel/tensor_parallel.h"

namespace megatron::nn {

void vocab_parallel_cross_entropy(Context& ctx, const parallel::TensorParallel& tp, const Tensor& losses,
                                  const Tensor& lse, const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                  int64_t global_vocab);
void vocab_parallel_cross_entropy_backward(Context& ctx, const parallel::TensorParallel& tp, const Tensor& dlogits,
                                           const Tensor& dlosses, const Tensor& logits, const Tensor& targets,
                                           const Tensor& lse, int64_t vocab_start, int64_t global_vocab);
// Both, for the training step (dlosses known before the forward): at TP = 1 the single-pass
// ops::cross_entropy_forward_backward, otherwise the two functions above.
void vocab_parallel_cross_entropy_forward_backward(Context& ctx, const parallel::TensorParallel& tp,
                                                   const Tensor& losses, const Tensor& lse, const Tensor& dlogits,
                                                   const Tensor& dlosses, const Tensor& logits, const Tensor& targets,
                                                   int64_t vocab_start, int64_t global_vocab);

}  // namespace megatron::nn
