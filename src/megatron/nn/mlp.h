// MLP: linear_fc1 -> GELU (tanh) or SwiGLU -> linear_fc2 (Megatron's MLP).
//
// linear_fc1 [F * (2 if swiglu), h]; with SwiGLU its rows are Megatron's fused [gate | up] (the first F
// output columns gate, the last F up). linear_fc2 [h, F], init std / sqrt(2 * num_layers).
// forward(ctx, out, x): x [..., h] -> out [..., h] assigned. Saves the fc1 output (pre-activation) and,
//   through linear_fc2, the activation.
// backward(ctx, dx, dout): dx assigned; main grads accumulated (+=).
#pragma once

#include <string>

#include "megatron/nn/config.h"
#include "megatron/nn/linear.h"

namespace megatron::nn {

class MLP {
 public:
  MLP() = default;
  MLP(Context& ctx, const std::string& name, const ModelConfig& config);

  void init(Context& ctx, const ModelConfig& config);
  void forward(Context& ctx, const Tensor& out, const Tensor& x);
  void backward(Context& ctx, const Tensor& dx, const Tensor& dout);
  void collect_parameters(ParameterList& out);

  Linear linear_fc1;
  Linear linear_fc2;

 private:
  bool swiglu_ = false;
  int64_t ffn_ = 0;
  Tensor pre_act_;
};

}  // namespace megatron::nn
