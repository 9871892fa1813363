// Linear: y = x W^T + b, W [out, in] (nn.Linear / Megatron layout), b [out] (optional).
//
// forward(ctx, y, x):   x [..., in], y [..., out] assigned.
// forward(ctx, y, x, gelu_input_out): y = gelu(x W^T + b) from the gemm's epilogue (tanh GELU, fp32), and
//   gelu_input_out [..., out] receives x W^T + b, what the GELU's backward needs. One pass instead of two.
// backward(ctx, dx, dy): dy [..., out];
//   dx = dy W            assigned (dx may be undefined: the input gradient is not wanted); with
//                        dx_gelu_input (the pre-GELU values of a GELU whose output was x) the GELU's backward
//                        rides on the same gemm: dx = (dy W) * gelu'(dx_gelu_input), the pre-activation's
//                        gradient;
//   W.main_grad += dy^T x (gemm with beta = 1 straight into the F32/F64 main grad);
//   b.main_grad += sum over rows of dy (from the dW gemm's bias-gradient epilogue, then added).
// All tensors share the parameter dtype; main grads are F32 (F64 for F64 parameters).
// The functions take the parameters they use (modules own them: ColumnParallelLinear, RowParallelLinear, the
// output layer); linear_backward is linear_backward_input (dx) then linear_backward_weight (main grads), which
// tensor-parallel layers call separately to overlap a collective on dx with the weight-gradient GEMM.
// LinearSaved is what a linear layer's forward leaves for its backward: the input the weight gradient needs
// (a handle to the caller's tensor, no copy; an FP8 linear keeps its quantised transpose instead,
// fp8_linear.h). It belongs to the micro-batch: the layer keeps nothing.
#pragma once

#include "megatron/nn/parameter.h"
#include "megatron/ops/gemm/gemm.h"

namespace megatron::nn {

struct LinearSaved {
  Tensor x;            // the input [..., in] (parameter-dtype linears)
  Tensor x_fp8_t;      // FP8 linears: the input quantised and transposed [in, rows] ...
  Tensor x_scale_inv;  // ... and its dequantisation scale (F32 [1], or block scales in ...
  ops::Fp8ScaleLayout x_scale_layout = ops::Fp8ScaleLayout::Tensor;  // ... this layout)
  bool defined() const { return x.defined() || x_fp8_t.defined(); }
};

void linear_forward(Context& ctx, const Tensor& y, const Tensor& x, const Parameter& weight, const Parameter* bias,
                    const Tensor& gelu_input_out = Tensor());
void linear_backward(Context& ctx, const Tensor& dx, const Tensor& dy, const Tensor& x, Parameter& weight,
                     Parameter* bias, const Tensor& dx_gelu_input = Tensor());
void linear_backward_input(Context& ctx, const Tensor& dx, const Tensor& dy, const Parameter& weight,
                           const Tensor& dx_gelu_input = Tensor());
void linear_backward_weight(Context& ctx, const Tensor& dy, const Tensor& x, Parameter& weight, Parameter* bias);

}  // namespace megatron::nn
