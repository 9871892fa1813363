// TransformerLayer: Megatron's pre-norm block.
//
//   h   = x + dropout(self_attention(input_layernorm(x)))
//   out = h + dropout(mlp(pre_mlp_layernorm(h)))
//
// Hidden dropout (--hidden-dropout, only when training) uses Philox (config.seed, offset, index_base 0);
// the caller passes a base offset per call, and the two dropout sites take base + 0 and base + 1
// (kDropoutSites).
// forward(ctx, out, x, training, dropout_offset): x, out [b, s, h]; out assigned. The norms save x and h,
//   the sub-modules what they need.
// backward(ctx, dx, dout): dx assigned; every parameter's main grad accumulated (+=). The residual
//   gradients ride on the norms' fused `dresidual` input.
#pragma once

#include <string>

#include "megatron/nn/attention.h"
#include "megatron/nn/config.h"
#include "megatron/nn/mlp.h"
#include "megatron/nn/norm.h"

namespace megatron::nn {

class TransformerLayer {
 public:
  static constexpr uint64_t kDropoutSites = 2;

  TransformerLayer() = default;
  // `prefix` e.g. "decoder.layers.3".
  TransformerLayer(Context& ctx, const std::string& prefix, const ModelConfig& config);

  void init(Context& ctx, const ModelConfig& config);
  void forward(Context& ctx, const Tensor& out, const Tensor& x, bool training, uint64_t dropout_offset);
  void backward(Context& ctx, const Tensor& dx, const Tensor& dout);
  void collect_parameters(ParameterList& out);

  Norm input_layernorm;
  SelfAttention self_attention;
  Norm pre_mlp_layernorm;
  MLP mlp;

 private:
  // y = residual + dropout(x); its backward: dx = dropout'(dy) (dy itself when p == 0).
  void residual_dropout_forward(Context& ctx, const Tensor& y, const Tensor& x, const Tensor& residual,
                                uint64_t offset);
  Tensor dropout_backward(Context& ctx, const Tensor& dy, uint64_t offset);

  uint64_t seed_ = 0;
  float dropout_p_ = 0.0f;
  float active_p_ = 0.0f;  // dropout_p_ in training, 0 in eval
  uint64_t dropout_offset_ = 0;
};

}  // namespace megatron::nn
