// TransformerLayer: Megatron's pre-norm block.
//
//   h   = x + dropout(self_attention(input_layernorm(x)))
//   out = h + dropout(mlp(pre_mlp_layernorm(h)))          mlp: the dense MLP, or the MoE layer on MoE layers
//
// The residual stream travels between layers as a pair (ResidualStream): the hidden state is residual +
// branch, and the sum is formed by the next norm in its own pass (the norms' fused residual add), so no
// layer spends a memory pass on the additions: input_layernorm adds the incoming pair, pre_mlp_layernorm
// adds x and the attention branch, and the layer hands on (h, dropout(mlp)) for the next input_layernorm
// (or the final norm) to add.
//
// Attention dropout (--attention-dropout, only when training) is the attention core's (attention.h), at
// pass.attention_dropout_offset.
// Hidden dropout (--hidden-dropout, only when training) uses Philox (config.seed, offset) addressed by the
// element's index in the whole micro-batch's [b * S, h] tensor (nn/dropout_rows.h: sequence-parallel shards
// and context-parallel chunks address their rows there), so every layout draws the one-rank mask for every
// element; the caller passes a base offset per call, and the two dropout sites take base + 0 and base + 1
// (kDropoutSites).
// Context parallelism: the rows are this rank's tokens of each sequence (parallel/context_parallel.h's
// split), pass.positions their positions; only the attention core communicates (SelfAttention).
// Tensor parallelism: attention and MLP are the column-/row-parallel pairs; the norms, dropout and the
// residual stream are the sequence-parallel region: [b * s, h] on every TP rank, or this rank's token rows
// [b * s / TP, h] under sequence parallelism (parallel/tensor_parallel.h).
// forward(ctx, out, x, pass): x the incoming stream (each [rows, h], or [b, s, h]; branch may be undefined,
//   e.g. the embedding's output or a pipeline stage's input), holding whole sequences of length pass.seq
//   (their rows of this rank under SP; seq 0: x is [b, s, h]); out receives the outgoing stream, shaped like
//   x. Returns everything the backward needs (the norms' sums and statistics, the sub-modules' saved state,
//   the pass's dropout addressing): the layer itself keeps nothing, so any number of micro-batches can be
//   between their forward and their backward.
// backward(ctx, saved, dx, dout): dout is the gradient of the outgoing hidden state (residual + branch); dx,
//   the gradient of the incoming one, is assigned; every parameter's main grad accumulated (+=); consumes
//   `saved`. The residual gradients ride on the norms' fused `dresidual` input.
#pragma once

#include <memory>
#include <string>

#include "megatron/nn/attention.h"
#include "megatron/nn/dropout_rows.h"
#include "megatron/nn/transformer_config.h"
#include "megatron/nn/mlp.h"
#include "megatron/nn/moe_layer.h"
#include "megatron/nn/norm.h"
#include "megatron/runtime/timers.h"

namespace megatron::nn {

// A hidden state kept as an unevaluated sum: residual + branch (branch undefined: just residual).
struct ResidualStream {
  Tensor residual;
  Tensor branch;
};

// y = norm(stream), forming the sum in the norm's pass when the stream has a branch.
[[nodiscard]] NormSaved norm_of_stream(Context& ctx, const Norm& norm, const Tensor& y, const ResidualStream& stream);

// One forward pass of a layer: training (hidden dropout on) or not, the base of its two dropout sites'
// Philox offsets, the sequence length of the rows it sees (this rank's tokens of each sequence under context
// parallelism), the positions of those tokens (context parallelism, device I64 [seq]; undefined: 0 .. seq-1),
// and for generation the layer's key/value cache and the position of the first of the seq new tokens
// (attention.h).
struct LayerPass {
  bool training = false;
  uint64_t dropout_offset = 0;
  uint64_t attention_dropout_offset = 0;  // the attention core's dropout (config.attention_dropout)
  int64_t seq = 0;
  Tensor positions;   // [s] shared by the rows (context parallelism), or [b, s] (--reset-position-ids)
  Tensor cu_seqlens;  // host I64: the micro-batch's documents (--reset-attention-mask; attention.h)
  KvCache* kv_cache = nullptr;
  int64_t position = 0;
  double moe_loss_grad_scale = 1.0;  // MoE layers: the router losses' gradient scale (moe_router.h)
  Timers* timers = nullptr;          // MoE layers: the token exchange's level-2 timers (null: none)
  // Full recomputation's second forward of the layer: the same computation; MoE routers do not count their
  // tokens (expert bias) or losses (the logged metrics) again.
  bool recomputing = false;
};

// Where a pass's hidden-dropout masks come from (p = 0: no dropout), kept for the backward: site k is
// `rows` with offset + k.
struct DropoutSites {
  DropoutRows rows;
};

struct TransformerLayerSaved {
  NormSaved input_norm;
  AttentionSaved attention;
  NormSaved pre_mlp_norm;
  MLPSaved mlp;  // dense layers
  MoESaved moe;  // MoE layers
  Tensor mlp_input;  // selective recomputation of the dense MLP (or the MoE layer): its input, `mlp` (`moe`) left
                     // empty until the backward
  TokenRows moe_rows;  // selective "moe": the MoE layer's token rows, for its forward again
  // Selective recomputation of the norms: their outputs were dropped from QKV's saved input (input_norm_dropped)
  // and from fc1's or the recomputed MLP's input (pre_mlp_norm_dropped); the backward normalises again.
  bool input_norm_dropped = false, pre_mlp_norm_dropped = false;
  double moe_loss_grad_scale = 1.0;
  DropoutSites dropout;
};

class TransformerLayer {
 public:
  static constexpr uint64_t kDropoutSites = 2;

  TransformerLayer() = default;
  // `prefix` e.g. "decoder.layers.3".
  // `layer`: the global layer number (its context-parallel communication type).
  // `moe`: the expert layout of an MoE layer (config.moe.is_moe_layer(layer)).
  TransformerLayer(Context& ctx, const std::string& prefix, const TransformerConfig& config,
                   const parallel::TensorParallel& tp = {}, const parallel::ContextParallel& cp = {}, int layer = 0,
                   const MoeParallel& moe = {});

  void init(Context& ctx, const TransformerConfig& config);
  [[nodiscard]] TransformerLayerSaved forward(Context& ctx, ResidualStream& out, const ResidualStream& x,
                                              const LayerPass& pass) const;
  void backward(Context& ctx, TransformerLayerSaved&& saved, const Tensor& dx, const Tensor& dout);
  void collect_parameters(ParameterList& out);
  // Runs the layer's linears in FP8 (attention's QKV and projection, a dense MLP's fc1 and fc2; a MoE layer's
  // router and experts stay in the parameter dtype), registered with the chunk's scaling state.
  void enable_fp8(const std::shared_ptr<Fp8ScalingState>& state);

  Norm input_layernorm;
  SelfAttention self_attention;
  Norm pre_mlp_layernorm;
  MLP mlp;        // the MLP slot: a dense MLP ...
  MoELayer moe;   // ... or a Mixture of Experts (moe.defined())

 private:
  // dropout(x) at site `site` (a new tensor), or x itself when sites.p == 0.
  Tensor dropout_forward(Context& ctx, const Tensor& x, const DropoutSites& sites, uint64_t site) const;
  // Its backward: dropout'(dy) (dy itself when sites.p == 0).
  Tensor dropout_backward(Context& ctx, const Tensor& dy, const DropoutSites& sites, uint64_t site) const;

  parallel::TensorParallel tp_;
  parallel::ContextParallel cp_;
  uint64_t seed_ = 0;
  float dropout_p_ = 0.0f;
  bool recompute_mlp_ = false;  // selective recomputation of the dense MLP (recompute.h)
  bool recompute_moe_ = false;  // selective recomputation of the MoE layer (recompute.h)
  bool recompute_norms_ = false;  // selective recomputation of the norms' outputs (recompute.h)
};

}  // namespace megatron::nn
