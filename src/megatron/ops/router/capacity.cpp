// Validation and dispatch of router_drop_over_capacity (see capacity.h).
#include "megatron/ops/router/capacity.h"

#include "megatron/ops/dispatch.h"
#include "megatron/ops/router/cpu.h"
#include "megatron/tensor/op_checks.h"

#if MEGATRON_WITH_CUDA
#include "megatron/ops/router/cuda.h"
#endif

namespace megatron::ops {

void router_drop_over_capacity(Context& ctx, const Tensor& kept_probs, const Tensor& kept_indices, const Tensor& probs,
                               const Tensor& indices, int num_experts, int64_t capacity, bool by_probs) {
  using enum DType;
  OpCheck check("router_drop_over_capacity");
  check.device(ctx, {{"kept_probs", kept_probs}, {"kept_indices", kept_indices}, {"probs", probs}, {"indices", indices}})
      .rank("probs", probs, 2)
      .shape("indices", indices, probs.shape())
      .shape("kept_probs", kept_probs, probs.shape())
      .shape("kept_indices", kept_indices, probs.shape())
      .dtype("indices", indices, I32)
      .dtype("kept_indices", kept_indices, I32)
      .dtype("kept_probs", kept_probs, probs.dtype());
  if (ctx.is_cuda()) check.dtype("probs", probs, F32);
  else check.dtype_in("probs", probs, {F32, F64});
  check.that(num_experts >= 1, "num_experts must be >= 1, got ", num_experts);
  check.that(capacity >= 0, "capacity must be >= 0, got ", capacity);
  check.that(kept_probs.data_ptr() != probs.data_ptr() && kept_indices.data_ptr() != indices.data_ptr(),
             "the kept outputs must be separate from the inputs");
  if (probs.numel() == 0) return;
  MEGATRON_DISPATCH(ctx,
                    cuda::router_drop_over_capacity(ctx, kept_probs, kept_indices, probs, indices, num_experts,
                                                    capacity, by_probs),
                    cpu::router_drop_over_capacity(kept_probs, kept_indices, probs, indices, num_experts, capacity,
                                                   by_probs));
}

}  // namespace megatron::ops
