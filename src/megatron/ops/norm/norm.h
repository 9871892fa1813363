// LayerNorm and RMSNorm over the last dimension, forward and backward, with an optional fused residual add.
//
// Shapes: x is any tensor of rank >= 1 viewed as rows [R, H] (H = last extent, R = the product of the
// others; R or H may be 1). weight (gamma) and bias (beta) are [H]. Statistics (mean, rstd) are [R].
// Dtypes: x, y, residual, residual_out, dy, dx, dresidual share one dtype: F32, BF16 or F16 (F64 on the CPU).
//   weight/bias: x's dtype or F32 (Megatron keeps norm params in bf16 but a master copy in fp32); both the
//   same dtype. mean/rstd, dweight/dbias: F32 (F64 also allowed when x is F64, for gradient checks).
// Math: all statistics and products in fp32 on CUDA (fp64 in the CPU reference); rstd = 1/sqrt(var + eps).
//   LayerNorm: mean = sum(x)/H, var = sum((x-mean)^2)/H (biased), y = (x-mean)*rstd*w + b.
//   RMSNorm:   rstd = 1/sqrt(sum(x^2)/H + eps), y = x*rstd*w.
// Fused residual (pre-norm "add then norm"): residual_out = x + residual, rounded to x's dtype, and the
//   rounded residual_out is what gets normalised. Pass residual_out as `x` to the backward.
// Backward: dx is assigned (plus dresidual when given: the residual stream's gradient, added in the same
//   pass); dweight/dbias are assigned, or accumulated (+=) when accumulate_weight_grads (gradient
//   accumulation across micro-batches). dweight/dbias reduce over rows deterministically (per-block partial
//   sums in an F32 scratch, then a column reduction; no atomics): same inputs and device, same bits.
// `bias` may be an undefined Tensor (no bias); then `dbias` must be undefined too. `dbias` may be undefined
//   even with a bias when its gradient is not wanted.
#pragma once

#include "megatron/runtime/context.h"

namespace megatron::ops {

void layer_norm_forward(Context& ctx, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                        const Tensor& weight, const Tensor& bias, float eps);
// Fused residual add: residual_out = x + residual; then LayerNorm of residual_out.
void layer_norm_forward(Context& ctx, const Tensor& y, const Tensor& residual_out, const Tensor& mean,
                        const Tensor& rstd, const Tensor& x, const Tensor& residual, const Tensor& weight,
                        const Tensor& bias, float eps);

void rms_norm_forward(Context& ctx, const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                      float eps);
// Fused residual add: residual_out = x + residual; then RMSNorm of residual_out.
void rms_norm_forward(Context& ctx, const Tensor& y, const Tensor& residual_out, const Tensor& rstd,
                      const Tensor& x, const Tensor& residual, const Tensor& weight, float eps);

// x, mean, rstd: as saved by the forward (x = residual_out for the fused variant). `dresidual` may be
// undefined; when defined, dx = (norm's input gradient) + dresidual.
void layer_norm_backward(Context& ctx, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                         const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, bool accumulate_weight_grads, const Tensor& dresidual = Tensor());

void rms_norm_backward(Context& ctx, const Tensor& dx, const Tensor& dweight, const Tensor& dy, const Tensor& x,
                       const Tensor& weight, const Tensor& rstd, bool accumulate_weight_grads,
                       const Tensor& dresidual = Tensor());

}  // namespace megatron::ops
