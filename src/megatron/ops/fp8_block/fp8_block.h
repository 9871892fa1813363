// FP8 block scaling's casts: DeepSeek-V3's recipe as Transformer Engine's Float8BlockScaling implements it
// (Megatron's --fp8-recipe blockwise), producing the operands of gemm's block-scaled layouts (gemm.h):
// activations and gradients get one scale per 1 x 128 block along the reduced dimension, weights one per
// 128 x 128 block.
//
// fp8_block_quantize(ctx, q, q_scale_inv, q_t, q_t_scale_inv, in, layout)
//   in [rows, cols] F32/BF16/F16 (F64 on the CPU). The outputs come in pairs, each pair defined or undefined
//   (not wanted), at least one pair given, both fp8 outputs of one dtype (F8E4M3 or F8E5M2):
//   layout Rows1x128 (an activation or gradient, quantised for both GEMMs that read it):
//     q [rows, cols], q_scale_inv F32 fp8_scale_shape(Rows1x128, rows, cols): each row's 128-column blocks
//       scaled by their own amax (the operand for a GEMM reducing over cols);
//     q_t [cols, rows], q_t_scale_inv F32 fp8_scale_shape(Rows1x128, cols, rows): `in` transposed, each
//       column's 128-row blocks scaled by their own amax (the operand for a GEMM reducing over rows). q_t is
//       quantised from `in` on its own, not from q: the two blockings differ, as in Transformer Engine.
//   layout Blocks128x128 (a weight): one scale per 128 x 128 block;
//     q [rows, cols], q_scale_inv fp8_scale_shape(Blocks128x128, rows, cols);
//     q_t [cols, rows], q_t_scale_inv fp8_scale_shape(Blocks128x128, cols, rows): q's bytes and scales
//       transposed (a square block serves both orientations).
//   Per block (edge blocks cover what is left of the tensor): amax = max |in| over the block (any NaN makes it
//   NaN); scale = fp8_max / amax as one fp32 division, 1 when amax is 0, inf or NaN, FLT_MAX when the division
//   overflows; then rounded down to a power of two (mantissa bits cleared: Transformer Engine's default
//   power_2_scale, which makes scale_inv = 1 / scale exact). Codes: fp8(in * scale) with the product in fp32
//   (F64 input: in fp64, narrowed through fp32 as from_double does) rounded once by core/fp8_convert.h's rules
//   (nearest even, saturating, NaN -> NaN). Padding entries of the scale tensors are written 0. CPU and CUDA
//   give identical bits. No amax or scale state is kept anywhere: every call is its own current scaling.
#pragma once

#include "megatron/ops/gemm/gemm.h"
#include "megatron/runtime/context.h"

namespace megatron::ops {

void fp8_block_quantize(Context& ctx, const Tensor& q, const Tensor& q_scale_inv, const Tensor& q_t,
                        const Tensor& q_t_scale_inv, const Tensor& in, Fp8ScaleLayout layout);

}  // namespace megatron::ops
