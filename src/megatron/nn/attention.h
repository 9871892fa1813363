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
// forward(ctx, out, x): x [b, s, h] -> out [b, s, h] assigned (linear_proj's bias included).
//   Saves q (after RoPE), k, v, the attention output and its LSE stats, plus the two Linears' inputs.
// backward(ctx, dx, dout): dx assigned; every parameter's main grad accumulated (+=).
// RoPE (position_embedding_type rope) rotates q and k: rotary_percent, rotary_base, positions 0..s-1.
#pragma once

#include <optional>
#include <string>

#include "megatron/nn/config.h"
#include "megatron/nn/linear.h"
#include "megatron/ops/rope/rope.h"

namespace megatron::nn {

class SelfAttention {
 public:
  SelfAttention() = default;
  SelfAttention(Context& ctx, const std::string& name, const ModelConfig& config);

  void init(Context& ctx, const ModelConfig& config);
  void forward(Context& ctx, const Tensor& out, const Tensor& x);
  void backward(Context& ctx, const Tensor& dx, const Tensor& dout);
  void collect_parameters(ParameterList& out);

  Linear linear_qkv;   // [g * (n/g + 2) * d, h]
  Linear linear_proj;  // [h, n * d]

 private:
  std::optional<ops::RopeOptions> rope() const;  // none without RoPE
  bool packed() const { return g_ == n_ && !rope_; }

  int64_t n_ = 0, g_ = 0, d_ = 0;
  bool rope_ = false;
  bool deterministic_ = false;
  double rotary_percent_ = 1.0, rotary_base_ = 10000.0;
  Tensor qkv_, q_, k_, v_, attn_out_, stats_;  // saved: qkv_ (packed) or q_, k_, v_
};

}  // namespace megatron::nn
