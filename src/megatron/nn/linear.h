// Linear: y = x W^T + b, W [out, in] (nn.Linear / Megatron layout), b [out] (optional).
//
// forward(ctx, y, x):   x [..., in], y [..., out] assigned. Saves x (a handle, no copy).
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
// linear_forward/linear_backward are the same computation on borrowed parameters (the tied output layer);
// linear_backward is linear_backward_input (dx) then linear_backward_weight (main grads), which tensor-parallel
// layers call separately to overlap a collective on dx with the weight-gradient GEMM.
#pragma once

#include <string>

#include "megatron/nn/parameter.h"

namespace megatron::nn {

void linear_forward(Context& ctx, const Tensor& y, const Tensor& x, const Parameter& weight, const Parameter* bias,
                    const Tensor& gelu_input_out = Tensor());
void linear_backward(Context& ctx, const Tensor& dx, const Tensor& dy, const Tensor& x, Parameter& weight,
                     Parameter* bias, const Tensor& dx_gelu_input = Tensor());
void linear_backward_input(Context& ctx, const Tensor& dx, const Tensor& dy, const Parameter& weight,
                           const Tensor& dx_gelu_input = Tensor());
void linear_backward_weight(Context& ctx, const Tensor& dy, const Tensor& x, Parameter& weight, Parameter* bias);

class Linear {
 public:
  Linear() = default;
  // Parameters "<name>.weight" [out, in] and, with `bias`, "<name>.bias" [out].
  Linear(Context& ctx, const std::string& name, int64_t in_features, int64_t out_features, bool bias, DType dtype);

  // weight ~ normal(0, std) (Philox, offset = hash of its name), bias = 0.
  void init(Context& ctx, uint64_t seed, double std);

  void forward(Context& ctx, const Tensor& y, const Tensor& x, const Tensor& gelu_input_out = Tensor());
  void backward(Context& ctx, const Tensor& dx, const Tensor& dy, const Tensor& dx_gelu_input = Tensor());

  void collect_parameters(ParameterList& out);
  int64_t in_features() const { return weight.value.dim(1); }
  int64_t out_features() const { return weight.value.dim(0); }

  Parameter weight;
  Parameter bias;  // undefined without bias

 private:
  Tensor saved_x_;
};

}  // namespace megatron::nn
