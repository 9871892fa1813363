// Validation and dispatch of fp8_block_quantize.
#include "megatron/ops/fp8_block/fp8_block.h"

#include "megatron/ops/dispatch.h"
#include "megatron/ops/fp8_block/cpu.h"
#include "megatron/tensor/op_checks.h"

#if MEGATRON_WITH_CUDA
#include "megatron/ops/fp8_block/cuda.h"
#endif

namespace megatron::ops {

namespace {

using enum DType;

// One output pair: both defined or both undefined; the codes' shape, the scales' shape from gemm.h.
void check_pair(OpCheck& check, Context& ctx, const char* name, const Tensor& q, const char* scale_name,
                const Tensor& scale_inv, int64_t rows, int64_t cols, Fp8ScaleLayout layout) {
  check.that(q.defined() == scale_inv.defined(), name, " and ", scale_name, " must both be given or both be undefined; got ",
             name, " ", q.describe(), ", ", scale_name, " ", scale_inv.describe());
  if (!q.defined()) return;
  check.device(ctx, {{name, q}, {scale_name, scale_inv}})
      .dtype_in(name, q, {F8E4M3, F8E5M2})
      .shape(name, q, Shape{rows, cols})
      .dtype(scale_name, scale_inv, F32)
      .shape(scale_name, scale_inv, fp8_scale_shape(layout, rows, cols));
}

}  // namespace

void fp8_block_quantize(Context& ctx, const Tensor& q, const Tensor& q_scale_inv, const Tensor& q_t,
                        const Tensor& q_t_scale_inv, const Tensor& in, Fp8ScaleLayout layout) {
  OpCheck check("fp8_block_quantize");
  check.device(ctx, {{"in", in}}).rank("in", in, 2);
  if (ctx.is_cuda()) check.dtype_in("in", in, {F32, BF16, F16});
  else check.dtype_in("in", in, {F64, F32, BF16, F16});
  check.that(layout != Fp8ScaleLayout::Tensor, "layout must be Rows1x128 or Blocks128x128 (per-tensor scaling is "
                                               "fp8_cast_transpose's)");
  check.that(q.defined() || q_t.defined(), "at least one of q and q_t must be given (both are undefined)");
  const int64_t rows = in.dim(0), cols = in.dim(1);
  check_pair(check, ctx, "q", q, "q_scale_inv", q_scale_inv, rows, cols, layout);
  check_pair(check, ctx, "q_t", q_t, "q_t_scale_inv", q_t_scale_inv, cols, rows, layout);
  if (q.defined() && q_t.defined()) check.same_dtype({{"q", q}, {"q_t", q_t}});
  if (in.numel() == 0) return;
  MEGATRON_DISPATCH(ctx, cuda::fp8_block_quantize(ctx, q, q_scale_inv, q_t, q_t_scale_inv, in, layout),
                    cpu::fp8_block_quantize(q, q_scale_inv, q_t, q_t_scale_inv, in, layout));
}

}  // namespace megatron::ops
