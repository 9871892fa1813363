// FP8 scaling ops: the casts an FP8 linear layer needs and the scale bookkeeping of Transformer Engine's
// per-tensor recipes (delayed scaling and current "tensorwise" scaling).
//
// Conventions (Transformer Engine's): `scale` multiplies a value into the fp8 range before the cast,
// `scale_inv` = 1 / scale dequantises (what cuBLASLt's A/B scale pointers take); `fp8_max` is the format's
// largest finite value (E4M3 448, E5M2 57344). Every scalar lives in a device F32 tensor, so no op here
// reads anything back to the host.
//
// fp8_cast_transpose(ctx, out, out_t, amax, in, scale)
//   in [rows, cols] F32/BF16/F16 (F64 on the CPU); scale F32 [1];
//   out   [rows, cols] F8E4M3 or F8E5M2, or undefined (not wanted): out[r, c]   = fp8(in[r, c] * scale[0]);
//   out_t [cols, rows] same fp8 dtype as out, or undefined:            out_t[c, r] = out[r, c];
//   amax  F32 [1] or undefined: amax[0] = max(amax[0], max |in|) (max-accumulated, so the micro-batches of
//         an iteration collect into one history slot; NaN in `in` makes it NaN).
//         The max is taken on bit patterns read as int32: non-negative floats order like their bits, every
//         NaN in `in` counts as the NaN 0x7FFFFFFF (above +inf), so the result is exact, independent of
//         order and the same on CPU and CUDA; an amax[0] holding a negative number or a negative NaN on
//         entry counts as below 0 (amaxes are never negative), a positive NaN stays NaN.
//   At least one of out / out_t; outputs must not overlap `in` or each other. The product in[r, c] * scale
//   is taken in fp32 and rounded once to fp8 with core/fp8_convert.h's rules (nearest even, saturating to
//   +-fp8_max, NaN -> 0x7F); F64 input multiplies in fp64 and narrows through fp32 as core's from_double
//   does (|in| enters amax as fp32). CPU and CUDA give bit-identical results. cuBLASLt's fp8 GEMMs take both
//   operands K-major, so the backward GEMMs need the transposes of x and dy: one read of `in` writes both.
//
// fp8_swiglu_cast_transpose(ctx, out, out_t, amax, x, scale)
//   x [rows, 2F] (activation.h's SwiGLU layout); out [rows, F], out_t [F, rows], amax and scale as above:
//   exactly swiglu_forward(y, x) then fp8_cast_transpose(out, out_t, amax, y, scale), without storing y.
//   On CUDA one kernel computes each value from x, rounds it to x's dtype (the value y would hold) and casts
//   it; where its vector loads do not fit (unaligned views, F not a multiple of 16 bytes of elements) and on
//   the CPU, the two ops run one after the other. The saving is y's write and read: an FP8 linear after
//   SwiGLU (fc2) reads its input through this.
// fp8_swiglu_grad_cast_transpose(ctx, out, out_t, amax, dy, x, scale)
//   dy [rows, F], x [rows, 2F] of one dtype; out [rows, 2F], out_t [2F, rows]: exactly
//   swiglu_backward(dx, dy, x) then fp8_cast_transpose(out, out_t, amax, dx, scale), without storing dx (the
//   output gradient entering fc1 when fc1 is an FP8 linear).
//
// fp8_scale_from_amax(ctx, scale, scale_inv, amax, fp8_max, margin, keep_on_invalid)
//   amax, scale, scale_inv F32 [n] (scale/scale_inv updated in place):
//   s = (fp8_max / amax[i]) / 2^margin, two fp32 divisions;
//   when amax[i] is not a positive finite number (0, inf or NaN): keep_on_invalid ? scale[i] unchanged
//   (delayed scaling keeps its previous scale) : 1 (current scaling of an all-zero tensor); when s
//   overflows fp32 (tiny amax): FLT_MAX; scale_inv[i] = 1 / scale[i] (fp32 division).
//   fp8_max must be positive and finite, margin in [-126, 127] (2^margin a normal fp32).
//
// fp8_delayed_scaling_update(ctx, history, scale, scale_inv, fp8_max, margin, use_max)
//   history F32 [L, n] (row 0: the amaxes recorded since the last update, already reduced over the amax
//   group), scale and scale_inv F32 [n]. Transformer Engine's _default_get_amax_and_update_history followed
//   by its scale computation:
//     amax[i] = use_max ? max over rows of history[:, i] : history[0, i]       ("max" / "most_recent")
//               (a NaN in the rows considered makes amax[i] NaN, as torch.max does, so the scale is kept);
//     scale, scale_inv from amax as fp8_scale_from_amax with keep_on_invalid = true;
//     then the history rolls one row up (torch.roll(h, -1, 0): new[r] = old[(r + 1) % L]) and row 0 is
//     zeroed, ready for the next iteration's amaxes.
#pragma once

#include "megatron/runtime/context.h"

namespace megatron::ops {

void fp8_cast_transpose(Context& ctx, const Tensor& out, const Tensor& out_t, const Tensor& amax, const Tensor& in,
                        const Tensor& scale);

void fp8_swiglu_cast_transpose(Context& ctx, const Tensor& out, const Tensor& out_t, const Tensor& amax,
                               const Tensor& x, const Tensor& scale);
void fp8_swiglu_grad_cast_transpose(Context& ctx, const Tensor& out, const Tensor& out_t, const Tensor& amax,
                                    const Tensor& dy, const Tensor& x, const Tensor& scale);

void fp8_scale_from_amax(Context& ctx, const Tensor& scale, const Tensor& scale_inv, const Tensor& amax,
                         float fp8_max, int margin, bool keep_on_invalid);

void fp8_delayed_scaling_update(Context& ctx, const Tensor& history, const Tensor& scale, const Tensor& scale_inv,
                                float fp8_max, int margin, bool use_max);

}  // namespace megatron::ops
