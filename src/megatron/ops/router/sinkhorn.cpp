// Validation and dispatch of the Sinkhorn routing ops (see sinkhorn.h for the contracts).
#include "megatron/ops/router/sinkhorn.h"

#include "megatron/ops/dispatch.h"
#include "megatron/ops/router/checks.h"
#include "megatron/ops/router/cpu.h"

#if MEGATRON_WITH_CUDA
#include "megatron/ops/router/cuda.h"
#endif

namespace megatron::ops {

using enum DType;

void router_sinkhorn(Context& ctx, const Tensor& balanced, const Tensor& logits) {
  OpCheck check("router_sinkhorn");
  check.device(ctx, {{"balanced", balanced}, {"logits", logits}});
  const DType dt = router_checks::check_logits(check, ctx, logits);
  check.shape("balanced", balanced, logits.shape()).dtype("balanced", balanced, dt);
  if (logits.dim(0) == 0) return;
  MEGATRON_DISPATCH(ctx, cuda::router_sinkhorn(ctx, balanced, logits), cpu::router_sinkhorn(balanced, logits));
}

void router_scores_at(Context& ctx, const Tensor& probs, const Tensor& scores, const Tensor& indices) {
  OpCheck check("router_scores_at");
  check.device(ctx, {{"probs", probs}, {"scores", scores}, {"indices", indices}});
  check.rank("scores", scores, 2).rank("indices", indices, 2).dtype("indices", indices, I32);
  if (ctx.is_cuda()) check.dtype("scores", scores, F32);
  else check.dtype_in("scores", scores, {F32, F64});
  check.shape("probs", probs, indices.shape()).dtype("probs", probs, scores.dtype());
  check.that(indices.dim(0) == scores.dim(0), "argument indices is ", indices.describe(), " but scores ",
             scores.describe(), " has ", scores.dim(0), " rows");
  if (indices.numel() == 0) return;  // no token, or k == 0: nothing to gather
  MEGATRON_DISPATCH(ctx, cuda::router_scores_at(ctx, probs, scores, indices),
                    cpu::router_scores_at(probs, scores, indices));
}

}  // namespace megatron::ops
