// TransformerLayer: Megatron's pre-norm block.
//
//   h   = x + dropout(self_attention(input_layernorm(x)))
//   out = h + dropout(mlp(pre_mlp_layernorm(h)))
//
// The residual stream travels between layers as a pair (ResidualStream): the hidden state is residual +
// branch, and the sum is formed by the next norm in its own pass (the norms' fused residual add), so no
// layer spends a memory pass on the additions: input_layernorm adds the incoming pair, pre_mlp_layernorm
// adds x and the attention branch, and the layer hands on (h, dropout(mlp)) for the next input_layernorm
// (or the final norm) to add.
//
// Hidden dropout (--hidden-dropout, only when training) uses Philox (config.seed, offset) addressed by the
// element's index in the whole [b * s, h] tensor (under sequence parallelism a rank's rows start at its
// first row's index), so every layout draws the TP = 1 mask for every element; the caller passes a base
// offset per call, and the two dropout sites take base + 0 and base + 1 (kDropoutSites).
// Tensor parallelism: attention and MLP are the column-/row-parallel pairs; the norms, dropout and the
// residual stream are the sequence-parallel region: [b * s, h] on every TP rank, or this rank's token rows
// [b * s / TP, h] under sequence parallelism (parallel/tensor_parallel.h).
// forward(ctx, x, training, dropout_offset, seq): x the incoming stream (each [rows, h], or [b, s, h];
//   branch may be undefined, e.g. the embedding's output), holding whole sequences of length seq (their
//   rows of this rank under SP; seq 0: x is [b, s, h]); returns the outgoing stream, shaped like x. The
//   norms save their sums, the sub-modules what they need.
// backward(ctx, dx, dout): dout is the gradient of the outgoing hidden state (residual + branch); dx, the
//   gradient of the incoming one, is assigned; every parameter's main grad accumulated (+=). The residual
//   gradients ride on the norms' fused `dresidual` input.
#pragma once

#include <string>

#include "megatron/nn/attention.h"
#include "megatron/nn/config.h"
#include "megatron/nn/mlp.h"
#include "megatron/nn/norm.h"

namespace megatron::nn {

// A hidden state kept as an unevaluated sum: residual + branch (branch undefined: just residual).
struct ResidualStream {
  Tensor residual;
  Tensor branch;
};

// y = norm(stream), forming the sum in the norm's pass when the stream has a branch.
void norm_of_stream(Context& ctx, Norm& norm, const Tensor& y, const ResidualStream& stream);

class TransformerLayer {
 public:
  static constexpr uint64_t kDropoutSites = 2;

  TransformerLayer() = default;
  // `prefix` e.g. "decoder.layers.3".
  TransformerLayer(Context& ctx, const std::string& prefix, const ModelConfig& config,
                   const parallel::TensorParallel& tp = {});

  void init(Context& ctx, const ModelConfig& config);
  ResidualStream forward(Context& ctx, const ResidualStream& x, bool training, uint64_t dropout_offset,
                         int64_t seq = 0);
  void backward(Context& ctx, const Tensor& dx, const Tensor& dout);
  void collect_parameters(ParameterList& out);

  Norm input_layernorm;
  SelfAttention self_attention;
  Norm pre_mlp_layernorm;
  MLP mlp;

 private:
  // dropout(x) in training with p > 0 (a new tensor), else x itself.
  Tensor dropout_forward(Context& ctx, const Tensor& x, uint64_t offset);
  // Its backward: dropout'(dy) (dy itself when p == 0).
  Tensor dropout_backward(Context& ctx, const Tensor& dy, uint64_t offset);

  parallel::TensorParallel tp_;
  uint64_t seed_ = 0;
  float dropout_p_ = 0.0f;
  float active_p_ = 0.0f;  // dropout_p_ in training, 0 in eval
  uint64_t dropout_offset_ = 0;
  uint64_t dropout_index_base_ = 0;  // whole-tensor index of this rank's first element
};

}  // namespace megatron::nn
