#include "megatron/nn/vocab_parallel_cross_entropy.h"

#include "megatron/ops/cross_entropy/cross_entropy.h"

namespace megatron::nn {

void vocab_parallel_cross_entropy(Context& ctx, const parallel::TensorParallel& tp, const Tensor& losses,
                                  const Tensor& lse, const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                  int64_t global_vocab) {
  if (!tp.enabled()) {
    ops::cross_entropy_forward(ctx, losses, lse, logits, targets);
    return;
  }
  const int64_t tokens = logits.dim(0);
  Tensor stats = ctx.empty({3, tokens}, lse.dtype());
  ops::vocab_parallel_cross_entropy_stats(ctx, stats, logits, targets, vocab_start, global_vocab);
  Tensor all = ctx.empty({tp.size(), 3, tokens}, lse.dtype());
  tp.group->all_gather(all, stats, ctx.stream());
  ops::vocab_parallel_cross_entropy_combine(ctx, losses, lse, all);
}

void vocab_parallel_cross_entropy_backward(Context& ctx, const parallel::TensorParallel& tp, const Tensor& dlogits,
                                           const Tensor& dlosses, const Tensor& logits, const Tensor& targets,
                                           const Tensor& lse, int64_t vocab_start, int64_t global_vocab) {
  if (!tp.enabled()) {
    ops::cross_entropy_backward(ctx, dlogits, dlosses, logits, targets, lse);
    return;
  }
  ops::vocab_parallel_cross_entropy_backward(ctx, dlogits, dlosses, logits, targets, lse, vocab_start, global_vocab);
}

void vocab_parallel_cross_entropy_forward_backward(Context& ctx, const parallel::TensorParallel& tp,
                                                   const Tensor& losses, const Tensor& lse, const Tensor& dlogits,
                                                   const Tensor& dlosses, const Tensor& logits, const Tensor& targets,
                                                   int64_t vocab_start, int64_t global_vocab) {
  if (!tp.enabled()) {
    ops::cross_entropy_forward_backward(ctx, losses, lse, dlogits, dlosses, logits, targets);
    return;
  }
  vocab_parallel_cross_entropy(ctx, tp, losses, lse, logits, targets, vocab_start, global_vocab);
  vocab_parallel_cross_entropy_backward(ctx, tp, dlogits, dlosses, logits, targets, lse, vocab_start, global_vocab);
}

}  // namespace megatron::nn
