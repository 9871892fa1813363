// gemm: D = epilogue(alpha * op(A) @ op(B) + beta * C), the matrix multiply every linear layer is made of.
//
// Contract (row-major tensors, as PyTorch/Megatron see them):
// - op(X) = X, or X^T when opt.transpose_a / opt.transpose_b is set.
//   A is [M, K] ([K, M] if transposed), B is [K, N] ([N, K] if transposed), D is [M, N].
// - Batched: A and D may be 3-D [batch, ., .]; B is then 3-D with the same batch, or 2-D and shared by every
//   batch entry (a weight). One strided-batched call.
// - beta == 0: D is assigned (=); its old contents are never read (NaN in D stays harmless).
//   beta != 0: D is read as C and accumulated into: D = alpha * op(A) op(B) + beta * D. This is how weight
//   gradients accumulate into fp32 main-grad buffers (bf16 inputs, F32 D, beta = 1).
// - Epilogues, applied to t = alpha * op(A) op(B) + beta * C in fp32:
//     Bias:      D = t + bias[n]                    bias [N]
//     Gelu:      D = gelu(t)                        (tanh approximation, below)
//     BiasGelu:  D = gelu(t + bias[n])
//     DGelu:     D = t * gelu'(gelu_input[m, n])      the GELU's backward fused into the gemm that produces
//                                                   its output gradient (cuBLASLt DGELU)
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
//   With Gelu/BiasGelu, `gelu_input_out` (optional, shape and dtype of D) receives the pre-GELU values
//   (t or t + bias), what the backward pass needs (cuBLASLt GELU_AUX). DGelu reads them back as
//   `gelu_input` (required, shape and dtype of D) and needs beta == 0 and non-fp8 inputs.
// - bias_grad_out (optional, [M], dtype of D, epilogue None, alpha == 1, no batch, non-fp8): assigned (=, even
//   when beta != 0) the row sums of op(A): bias_grad_out[m] = sum_k op(A)[m, k]. In the weight-gradient gemm
//   dW = dY^T X (A = dY with transpose_a, B = X) this is the bias gradient sum_t dY[t, :] (cuBLASLt BGRADB).
// - Dtypes: A and B both F32, both F16 or both BF16; D is F32 or the input dtype. F64 (all three) runs on
//   the CPU only. Accumulation is fp32 (CPU: double); F32 inputs are plain fp32 unless opt.allow_tf32.
//   bias has D's dtype.
// - FP8: A in {F8E4M3, F8E5M2}, B in {F8E4M3, F8E5M2}, not both E5M2. cuBLASLt's fp8 kernels need the
//   layout A [M, K] and B [N, K] (transpose_a = false, transpose_b = true: y = x W^T, the nn.Linear layout)
//   and M, N, K multiples of 16. a_scale and b_scale (F32 [1], required) are the *inverse* scales that
//   dequantise A and B (cuBLASLt A/B_SCALE_POINTER). D is BF16, F16 or F32 (bias BF16, or F16 for an F16
//   D), or fp8 with optional d_scale (F32 [1]): D = d_scale * t; fp8 D needs beta == 0 and no GELU.
//   d_amax_out (F32 [1], fp8 D only: cuBLASLt rejects amax for other outputs) receives max |t| over D,
//   before d_scale (assigned, not maxed in).
//   fp8_fast_accum trades accuracy for speed (no periodic promotion of the fp8 accumulators).
// - FP8 block scaling (DeepSeek-V3's recipe; cuBLASLt's VEC128_32F and BLK128x128_32F scale modes on Hopper):
//   a_scale_layout / b_scale_layout say how each operand's scale tensor dequantises it. For an operand X
//   [R, K] (A: R = M, B: R = N; both K-major, as the TN layout has them), with kb = ceil(K / 128),
//   rb = ceil(R / 128) and pad4(x) = x rounded up to a multiple of 4:
//     Tensor:        F32 [1]: every element times scale[0] (the default);
//     Rows1x128:     F32 [kb, pad4(R)]: X[r, k] times scale[k / 128, r] (one scale per row and 128-column
//                    block, rows contiguous);
//     Blocks128x128: F32 [rb, pad4(kb)]: X[r, k] times scale[r / 128, k / 128].
//   Padding entries are never read. Both operands block-scaled, at most one of them Blocks128x128 (cuBLASLt
//   has no 2-D x 2-D kernel); no batch, no fast accumulation (block scaling needs the promoted
//   accumulators), the none or bias epilogue, D BF16, F16, F32 (beta 0 or 1) or F64 (CPU), not fp8.
//   fp8_block_scale_shape below gives the shapes.
//
// Linear layer forward/backward with this op (Y = X W^T + b, X [T, in], W [out, in], dY [T, out]):
//   forward: gemm(ctx, Y, X, W, {.transpose_b = true, .epilogue = Bias, .bias = b})
//   dX = dY W:          gemm(ctx, dX, dY, W, {})
//   dW += dY^T X:       gemm(ctx, main_grad_W, dY, X, {.transpose_a = true, .beta = 1})
//   db = sum_t dY:      bias_grad_out on the call above, with beta = 0 (or a separate reduction).
//
// CPU: OpenBLAS sgemm/dgemm on tiles of D in parallel (gemm/cpu.cpp); narrow inputs are widened (fp8: with
// their scales) to fp32 first; epilogue in fp32 (double for F64); outputs rounded to D's dtype. CUDA: cuBLASLt on ctx.stream() with the context's 64 MiB workspace;
// the descriptors and the heuristic's best algorithm are cached per (shapes, dtypes, transposes, epilogue,
// alignments), so a repeated call queries nothing. Not thread-safe per Context (the plan cache is shared).
#pragma once

#include <cstdint>

#include "megatron/runtime/context.h"

namespace megatron::ops {

enum class GemmEpilogue : uint8_t { None, Bias, Gelu, BiasGelu, DGelu };
const char* gemm_epilogue_name(GemmEpilogue e);

// How an fp8 operand's scale tensor applies to it (see FP8 block scaling above).
enum class Fp8ScaleLayout : uint8_t { Tensor, Rows1x128, Blocks128x128 };
const char* fp8_scale_layout_name(Fp8ScaleLayout layout);

// The scale tensor's shape for an fp8 operand [rows, k] (k the reduced dimension) under `layout`.
Shape fp8_scale_shape(Fp8ScaleLayout layout, int64_t rows, int64_t k);

struct GemmOptions {
  bool transpose_a = false;
  bool transpose_b = false;
  float alpha = 1.0f;
  float beta = 0.0f;
  GemmEpilogue epilogue = GemmEpilogue::None;
  // (The `{}` initialisers keep designated initialisation, e.g. {.transpose_b = true}, warning-free.)
  Tensor bias{};            // [N], with Bias / BiasGelu
  Tensor gelu_input_out{};  // optional with Gelu / BiasGelu: pre-GELU values, shape and dtype of D
  Tensor gelu_input{};      // required with DGelu: the pre-GELU values the forward saved, shape and dtype of D
  Tensor bias_grad_out{};   // optional: [M] row sums of op(A) (see above)
  // fp8
  Tensor a_scale{}, b_scale{};  // inverse scales, required for fp8 inputs: F32 [1] or block scales
  Fp8ScaleLayout a_scale_layout = Fp8ScaleLayout::Tensor, b_scale_layout = Fp8ScaleLayout::Tensor;
  Tensor d_scale{};             // F32 [1], optional, fp8 D only
  Tensor d_amax_out{};          // F32 [1], optional, fp8 D only
  bool fp8_fast_accum = false;
  bool allow_tf32 = false;  // F32 inputs: let cuBLASLt use TF32 tensor cores
};

void gemm(Context& ctx, const Tensor& d, const Tensor& a, const Tensor& b, const GemmOptions& opt = {});

// Tanh-approximation GELU and its derivative (CPU helpers; the reference for the epilogue).
double gelu_tanh(double x);
double gelu_tanh_grad(double x);

}  // namespace megatron::ops
