// SelfAttention: Megatron's self-attention block (linear_qkv -> split -> RoPE -> causal core attention ->
// linear_proj), heads n, query groups g (MHA g == n, GQA, MQA g == 1), head dim d = kv_channels.
//
// Fused QKV weight layout (Megatron-core, [g * (n/g + 2) * d, h]): the rows are grouped per query group;
// group j holds its n/g query heads (d rows each), then its key head, then its value head. Query head
// j * (n/g) + i therefore reads key/value head j, which is the attention op's h / (n/g) rule.
// The split (and RoPE on q and k) is one fused pass, ops::split_qkv_forward; backward merges with
// ops::merge_qkv_backward. Multi-head attention without RoPE (g == n, GPT-2/GPT-3) skips both: with one
// query head per group the fused layout is [b, s, n, 3, d], which the packed attention op reads (and whose
// gradient it writes) in place.
//
// Tensor parallelism (split by heads): linear_qkv is column-parallel and linear_proj row-parallel. Rank r
// holds query groups [r * g / TP, (r + 1) * g / TP) with their query heads and key/value heads: in the fused
// layout that is one contiguous block of rows, so the local QKV projection has the same per-group layout with
// g / TP groups and n / TP heads, and split / RoPE / attention run unchanged on the local heads. linear_proj
// holds the matching columns [r * n d / TP, (r + 1) * n d / TP) and sums the ranks' partial outputs.
//
// forward(ctx, out, x, seq): x holds whole sequences of length seq: [b * s, h] (or [b, s, h]; seq 0 then
//   means x.dim(1)), or under sequence parallelism this rank's token rows [b * s / TP, h]; out like x,
//   assigned (linear_proj's bias included). Saves q (after RoPE), k, v, the attention output and its LSE
//   stats, plus the two projections' inputs.
// backward(ctx, dx, dout): dx like x, assigned; every parameter's main grad accumulated (+=).
// RoPE (position_embedding_type rope) rotates q and k: rotary_percent, rotary_base, positions 0..s-1.
#pragma once

#include <optional>
#include <string>

#include "megatron/nn/column_parallel_linear.h"
#include "megatron/nn/config.h"
#include "megatron/nn/row_parallel_linear.h"
#include "megatron/ops/rope/rope.h"

namespace megatron::nn {

class SelfAttention {
 public:
  SelfAttention() = default;
  SelfAttention(Context& ctx, const std::string& name, const ModelConfig& config,
                const parallel::TensorParallel& tp = {});

  void init(Context& ctx, const ModelConfig& config);
  void forward(Context& ctx, const Tensor& out, const Tensor& x, int64_t seq = 0);
  void backward(Context& ctx, const Tensor& dx, const Tensor& dout);
  void collect_parameters(ParameterList& out);

  ColumnParallelLinear linear_qkv;  // [g * (n/g + 2) * d / TP, h]
  RowParallelLinear linear_proj;    // [h, n * d / TP]

 private:
  std::optional<ops::RopeOptions> rope() const;  // none without RoPE
  bool packed() const { return g_ == n_ && !rope_; }

  parallel::TensorParallel tp_;
  int64_t n_ = 0, g_ = 0, d_ = 0;  // this rank's heads and groups
  bool rope_ = false;
  bool deterministic_ = false;
  double rotary_percent_ = 1.0, rotary_base_ = 10000.0;
  Tensor qkv_, q_, k_, v_, attn_out_, stats_;  // saved: qkv_ (packed) or q_, k_, v_
};

}  // namespace megatron::nn
