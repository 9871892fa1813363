#include "megatron/nn/moe_sinkhorn.h"

#include "megatron/ops/router/router.h"
#include "megatron/ops/router/sinkhorn.h"

namespace megatron::nn {

void sinkhorn_select(Context& ctx, const Tensor& indices, const Tensor& probs, const Tensor& logits,
                     const Tensor& scores) {
  Tensor balanced = ctx.empty(logits.shape(), logits.dtype() == DType::F64 ? DType::F64 : DType::F32);
  ops::router_sinkhorn(ctx, balanced, logits);
  ops::router_topk_indices(ctx, indices, balanced);
  ops::router_scores_at(ctx, probs, scores, indices);
}

}  // namespace megatron::nn
