// OCP Microscaling (MX) block quantisation of tensors, as Transformer Engine's MXFP8BlockScaling recipe
// casts them (MXFP8: E4M3 or E5M2 elements), and MXFP4 (E2M1 elements) with the same scale rule. The scalar
// rules (scale choice, rounding, special values, and why TE's rule rather than the OCP specification's)
// are in formats.h.
//
// Layout. `in` is viewed as [rows, cols] with cols its last (contiguous) dimension, rows the product of the
// others; cols must be a multiple of kMxBlock = 32 (rank >= 1). Each row splits into cols / 32 blocks of
// 32 consecutive elements, each with one E8M0 scale. This is TE's rowwise scaling; its columnwise copy (the
// transposed GEMM operand) is the same quantisation of the transposed tensor. Scales are stored plainly,
// row-major, neither padded nor swizzled into the tile layout a block-scaled GEMM reads.
//   codes : E4M3 -> F8E4M3 and E5M2 -> F8E5M2 with in's shape;
//           E2M1 -> U8 [rows, cols / 2], two elements per byte: element 2i in the low nibble, 2i + 1 in
//           the high nibble (TE's and PyTorch's float4_e2m1fn_x2 packing, and the hardware's);
//   scales: U8 [rows, cols / 32], E8M0 codes.
// codes and scales may carry any leading dimensions whose product is rows (mx_codes_shape and
// mx_scales_shape give in's own leading dimensions); only their last dimension and element count are
// checked.
//
// mx_quantize writes codes and scales from in: F32, BF16, F16 (computed in fp32, as TE's kernels) or F64
// (first rounded to fp32). mx_dequantize writes out (F32, BF16, F16, F64) = decode(code) * 2^(scale - 127),
// one fp32 multiply rounded once to out's dtype (F64 holds that fp32 product exactly). Values are a fixed
// point: quantising an F32 dequantised tensor and dequantising again gives the same values in every
// block without inf or NaN (not always the same codes: a block whose largest element rounded down to
// max_elem / 2 gets a scale one binade lower).
//
// Devices: CPU only. MX block scaling is a Blackwell (sm_100) tensor-core format: Hopper cannot run it,
// and these functions are the reference that future CUDA kernels must match bit for bit. A CUDA context
// is refused with that reason.
#pragma once

#include "megatron/ops/microscaling/formats.h"
#include "megatron/runtime/context.h"

namespace megatron::ops {

void mx_quantize(Context& ctx, const Tensor& codes, const Tensor& scales, const Tensor& in, MxElement element);
void mx_dequantize(Context& ctx, const Tensor& out, const Tensor& codes, const Tensor& scales, MxElement element);

// The dtype of codes: F8E4M3, F8E5M2 or U8 (E2M1, packed).
DType mx_codes_dtype(MxElement element);
// codes' shape for an input of shape `in`: in's, with the last dimension halved for E2M1.
Shape mx_codes_shape(const Shape& in, MxElement element);
// scales' shape for an input of shape `in`: in's, with the last dimension divided by 32.
Shape mx_scales_shape(const Shape& in);

}  // namespace megatron::ops
