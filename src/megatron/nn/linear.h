// Linear: y = x W^T + b, W [out, in] (nn.Linear / Megatron layout), b [out] (optional).
//
// forward(ctx, y, x):   x [..., in], y [..., out] assigned. Saves x (a handle, no copy).
// backward(ctx, dx, dy): dy [..., out];
//   dx = dy W            assigned (dx may be undefined: the input gradient is not wanted);
//   W.main_grad += dy^T x (gemm with beta = 1 straight into the F32/F64 main grad);
//   b.main_grad += sum over rows of dy (a gemm with a ones vector, also beta = 1).
// All tensors share the parameter dtype; main grads are F32 (F64 for F64 parameters).
// linear_forward/linear_backward are the same computation on borrowed parameters (the tied output layer).
#pragma once

#include <string>

#include "megatron/nn/parameter.h"

namespace megatron::nn {

void linear_forward(Context& ctx, const Tensor& y, const Tensor& x, const Parameter& weight, const Parameter* bias);
void linear_backward(Context& ctx, const Tensor& dx, const Tensor& dy, const Tensor& x, Parameter& weight,
                     Parameter* bias);

class Linear {
 public:
  Linear() = default;
  // Parameters "<name>.weight" [out, in] and, with `bias`, "<name>.bias" [out].
  Linear(Context& ctx, const std::string& name, int64_t in_features, int64_t out_features, bool bias, DType dtype);

  // weight ~ normal(0, std) (Philox, offset = hash of its name), bias = 0.
  void init(Context& ctx, uint64_t seed, double std);

  void forward(Context& ctx, const Tensor& y, const Tensor& x);
  void backward(Context& ctx, const Tensor& dx, const Tensor& dy);

  void collect_parameters(ParameterList& out);
  int64_t in_features() const { return weight.value.dim(1); }
  int64_t out_features() const { return weight.value.dim(0); }

  Parameter weight;
  Parameter bias;  // undefined without bias

 private:
  Tensor saved_x_;
};

}  // namespace megatron::nn
