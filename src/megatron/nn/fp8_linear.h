// The FP8 linear: y = x W^T + b with its three GEMMs in FP8 (the one place FP8 enters the model).
//
//   forward  y  = x W^T          x quantised to E4M3 [T, in], W to E4M3 [out, in]      (output: x's dtype)
//   dgrad    dx = dy W           dy quantised [T, out],        W^T [in, out]
//   wgrad    dW += dy^T x        dy^T [out, T],                x^T [in, T]           (into the F32 main grad)
// cuBLASLt's FP8 GEMMs take both operands K-major (ops/gemm/gemm.h), so the backward GEMMs read transposed
// copies: the input's cast writes x^T for the weight gradient in the same pass (only x^T, one byte an element,
// is kept for the backward instead of x), the output gradient's cast writes dy and dy^T, and the weight is
// cast once per iteration with its transpose (Fp8ScalingState; a weight kept in FP8, --fp8-param-gather, is
// used as it is and only transposed, with its own fp8_scale_inv). The GEMMs dequantise with the operands'
// scale_inv and accumulate in fp32. The bias (added by the forward GEMM's epilogue, its gradient the column
// sums of dy; with an F32 output it enters the epilogue rounded to bf16, cuBLASLt's rule for FP8 GEMMs) and a
// fused GELU (gelu_input_out / dx_gelu_input, as linear.h) stay in the output dtype; the GELU
// runs as its own pass after the GEMM here.
//
// Blockwise scaling (fp8_recipe.h) quantises each tensor with block scales instead (ops/fp8_block): the input
// and the output gradient in 1 x 128 blocks, their transposes quantised on their own (blocks along the tokens,
// which the weight gradient reduces over), the weight in 128 x 128 blocks; the GEMMs take the block scales
// (gemm.h). Blocks never cross a tensor-parallel shard, so a layout whose shards are multiples of 128 wide
// quantises exactly as one rank does; no amax is reduced anywhere.
// Scales (fp8_recipe.h): delayed scaling reads the state's scales and, while the state records, max-
// accumulates each tensor's amax into its history slot; tensorwise scaling computes the tensor's amax first
// and casts with fp8_max / amax / 2^margin. Tensors split over tensor parallelism (the column-parallel
// layer's weight and output gradient, the row-parallel layer's weight and input) take the amax of the whole
// tensor: tensorwise scaling all-reduces it (max) over `split_group` before computing the scale, so every
// layout casts with the scale one rank would (delayed scaling gets the same from its per-iteration
// reduction); under context parallelism the activations' and gradients' amaxes are reduced over CP as well. Shapes: the rows T, in and out must be multiples of 16 (cuBLASLt's FP8 kernels), checked with
// the layer's name.
#pragma once

#include "megatron/nn/fp8_scaling_state.h"
#include "megatron/nn/linear.h"
#include "megatron/nn/linear_operand.h"

namespace megatron::nn {

// A tensor quantised for the FP8 GEMMs.
struct Fp8Operand {
  Tensor q;            // [rows, cols], or undefined when not wanted
  Tensor q_t;          // [cols, rows], or undefined when not wanted
  Tensor scale_inv;    // q's dequantisation scales: F32 [1], or block scales in `layout` ...
  Tensor scale_inv_t;  // ... and q_t's (per-tensor scaling: the same F32 [1] tensor)
  ops::Fp8ScaleLayout layout = ops::Fp8ScaleLayout::Tensor;
};

// Which of a linear's tensors are split over tensor parallelism (their amax is then reduced over `group`),
// and the context-parallel group that splits every activation and gradient along the sequence (their amax is
// reduced over it too; weights are whole on every CP rank).
struct Fp8TensorSplit {
  comm::Communicator* group = nullptr;           // the TP group (null or size 1: nothing split)
  bool input = false, weight = false, grad = false;
  comm::Communicator* sequence_group = nullptr;  // the CP group (null or size 1: none)
};

// The groups a tensorwise amax is reduced over (each may be null).
struct Fp8AmaxGroups {
  comm::Communicator* tensor = nullptr;
  comm::Communicator* sequence = nullptr;
};

// in [rows, cols] -> fp8 `dtype`, scaled by the recipe with `slot` (delayed scaling's state for this tensor).
// `weight`: the tensor is a weight (128 x 128 blocks under the blockwise recipe; 1 x 128 otherwise).
// A produced operand (linear_operand.h) is computed inside the cast under delayed scaling, whose scale is
// known before the cast; the other recipes need the tensor first (its amax, its blocks) and materialise it.
Fp8Operand fp8_quantize(Context& ctx, const LinearOperand& in, DType dtype, const Fp8ScalingState& state,
                        const Fp8TensorScaling& slot, bool want_q, bool want_t, const Fp8AmaxGroups& groups,
                        bool weight = false);

// The linear's output gradient, quantised for both backward GEMMs.
struct Fp8Grad {
  int64_t rows = 0;  // T
  Tensor dy;         // [T, out], kept for the bias gradient only (undefined without a bias)
  Fp8Operand q;
};

LinearSaved fp8_linear_forward(Context& ctx, const Tensor& y, const LinearOperand& x, const Parameter& weight,
                               const Parameter* bias, const Fp8Site& site, const Fp8TensorSplit& split,
                               const Tensor& gelu_input_out = Tensor());
// `bias_gradient`: the layer has a bias whose gradient (dy's column sums) fp8_linear_backward_weight adds.
Fp8Grad fp8_linear_grad(Context& ctx, const LinearOperand& dy, const Fp8Site& site, const Fp8TensorSplit& split,
                        bool bias_gradient);
void fp8_linear_backward_input(Context& ctx, const Tensor& dx, const Fp8Grad& g, const Parameter& weight,
                               const Fp8Site& site, const Fp8TensorSplit& split,
                               const Tensor& dx_gelu_input = Tensor());
void fp8_linear_backward_weight(Context& ctx, const Fp8Grad& g, const LinearSaved& saved, Parameter& weight,
                                Parameter* bias);

}  // namespace megatron::nn
